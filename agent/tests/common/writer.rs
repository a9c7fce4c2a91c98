//! A client registering instances through the API as fast as it is answered, for tests
//! that change the group under load and then check nothing acknowledged was lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::Value;
use tokio::sync::watch;
use waymark_agent::api_client::ApiClient;
use waymark_testkit::until;

/// What the writer was told: the ids acknowledged, and every other answer.
#[derive(Debug, Default)]
pub struct Writes {
    /// Instance ids of the registrations answered `201`.
    pub acked: Vec<String>,
    /// Every other answer or error, as text.
    pub failed: Vec<String>,
}

/// A running writer; [`Writer::stop`] ends it.
pub struct Writer {
    writes: Arc<Mutex<Writes>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Registers `registration(0)`, `registration(1)`, … through `api`, one at a time.
    pub fn start(api: ApiClient, registration: fn(u32) -> Value) -> Self {
        let writes = Arc::new(Mutex::new(Writes::default()));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn({
            let writes = Arc::clone(&writes);
            async move {
                for i in 0.. {
                    if *stopped.borrow() {
                        break;
                    }
                    let r = api
                        .send(Method::POST, "/v1/instances", Some(&registration(i)))
                        .await;
                    let mut w = writes.lock().unwrap();
                    match r {
                        Ok(r) if r.status == StatusCode::CREATED => {
                            let body: Value = serde_json::from_slice(&r.body).unwrap();
                            w.acked.push(body["instance"].as_str().unwrap().to_owned());
                        }
                        Ok(r) => w.failed.push(format!(
                            "{}: {}",
                            r.status,
                            String::from_utf8_lossy(&r.body)
                        )),
                        Err(e) => w.failed.push(format!("{e:#}")),
                    }
                }
            }
        });
        Self { writes, stop, task }
    }

    /// How many writes were acknowledged so far.
    pub fn acked(&self) -> usize {
        self.writes.lock().unwrap().acked.len()
    }

    /// Waits (up to `wait`) until at least `n` writes were acknowledged.
    pub async fn acked_at_least(&self, n: usize, wait: Duration) {
        until("acknowledged writes", wait, async || {
            let got = self.acked();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    /// Stops writing and returns what it was told.
    pub async fn stop(self) -> Writes {
        self.stop.send_replace(true);
        self.task.await.unwrap();
        std::mem::take(&mut *self.writes.lock().unwrap())
    }
}
