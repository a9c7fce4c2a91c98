//! The leader's sidecar reports stay bounded (one per node, a capped number of nodes, a
//! silent node forgotten), and a node's config answer reaches only the request it was
//! asked.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::evidence::{SidecarClient, TypeSync, XdsProtocol};

fn node(name: &str) -> NodeName {
    name.parse().unwrap()
}

fn report(clients: usize) -> SidecarReport {
    SidecarReport {
        view_age: Some(Duration::from_secs(1)),
        clients: (0..clients)
            .map(|n| SidecarClient {
                client: format!("sidecar-{n}"),
                cluster: "web".into(),
                zone: "a".into(),
                identity: None,
                protocol: XdsProtocol::Delta,
                stream_id: n as u64,
                connected_for: Duration::from_secs(3),
                types: vec![TypeSync {
                    type_url: "t".into(),
                    sent: Some("1".into()),
                    acked: Some("1".into()),
                    ..TypeSync::default()
                }],
            })
            .collect(),
        clients_left_out: 0,
    }
}

fn held(r: &SidecarReports) -> Vec<(String, usize)> {
    r.reports()
        .map(|(n, h)| (n.to_string(), h.report.clients.len()))
        .collect()
}

#[test]
fn a_silent_nodes_report_expires_and_a_refreshed_one_stays() {
    // Goal: a node that went silent is forgotten after the TTL; one that keeps reporting
    // (every 30 s) never is, and a closed session alone forgets nothing.
    let t0 = tokio::time::Instant::now().into_std();
    let mut r = SidecarReports::new(SidecarsConfig::default());
    r.handle_report(t0, &node("n1"), report(2)).unwrap();
    r.handle_report(t0, &node("n2"), report(1)).unwrap();
    r.handle_session_closed(&node("n2"));
    assert_eq!(r.poll_timeout(), Some(t0 + REPORT_TTL));
    assert!(
        !r.reports()
            .find(|(n, _)| n.as_str() == "n2")
            .unwrap()
            .1
            .session_open
    );
    for step in 1..=3u32 {
        let at = t0 + Duration::from_secs(30) * step;
        assert_eq!(r.handle_timeout(at), usize::from(step == 3), "step {step}");
        r.handle_report(at, &node("n1"), report(2)).unwrap();
    }
    assert_eq!(held(&r), [("n1".to_owned(), 2)]);
    // n1 falls silent too.
    let end = t0 + Duration::from_secs(90) + REPORT_TTL;
    assert_eq!(r.handle_timeout(end), 1);
    assert!(held(&r).is_empty() && r.poll_timeout().is_none());
}

#[test]
fn a_report_replaces_the_last_and_a_node_past_the_cap_is_refused() {
    // Goal: one node's reports never add up (each replaces the last), and once `nodes_max`
    // nodes are held a new one is refused while the held ones still update.
    let t0 = tokio::time::Instant::now().into_std();
    let mut r = SidecarReports::new(SidecarsConfig {
        nodes_max: 2,
        ..SidecarsConfig::default()
    });
    for n in 0..5 {
        r.handle_report(t0, &node("n1"), report(n)).unwrap();
    }
    r.handle_report(t0, &node("n2"), report(1)).unwrap();
    assert_eq!(held(&r), [("n1".to_owned(), 4), ("n2".to_owned(), 1)]);
    let refused = r.handle_report(t0, &node("n3"), report(1)).unwrap_err();
    assert_eq!(refused, ReportRefused::Full { max: 2 });
    assert_eq!(refused.label(), "nodes_full");
    r.handle_report(t0, &node("n2"), report(3)).unwrap();
    assert_eq!(held(&r), [("n1".to_owned(), 4), ("n2".to_owned(), 3)]);
    // Room again once a report expires.
    let later = t0 + REPORT_TTL;
    assert_eq!(r.handle_timeout(later), 2);
    r.handle_report(later, &node("n3"), report(1)).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_config_answer_reaches_its_asker_and_only_from_the_node_asked() {
    // Goal: the request goes down the node's session; another node cannot answer it; the
    // node's answer is what the asker gets, and nothing stays pending.
    let broker = std::sync::Arc::new(ConfigBroker::default());
    let mut n1 = broker.attach(&node("n1"));
    let _n2 = broker.attach(&node("n2"));
    let asking = {
        let broker = std::sync::Arc::clone(&broker);
        tokio::spawn(async move { broker.ask(&node("n1"), "sidecar-1").await })
    };
    let request = n1.recv().await.unwrap();
    assert_eq!(request.client, "sidecar-1");
    let doc = json!({"client": "sidecar-1"});
    broker.answer(
        &node("n2"),
        ClientConfig {
            request_id: request.request_id,
            document: Some(json!({"client": "forged"})),
        },
    );
    broker.answer(
        &node("n1"),
        ClientConfig {
            request_id: request.request_id,
            document: Some(doc.clone()),
        },
    );
    assert_eq!(asking.await.unwrap(), Ok(Some(doc)));
    assert!(broker.pending() == 0);
    assert_eq!(
        broker.ask(&node("n9"), "x").await,
        Err(AskError::NotConnected(node("n9")))
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_that_does_not_answer_times_out_and_a_full_queue_is_busy() {
    // Goal: the API never waits longer than CONFIG_TIMEOUT, a request it gave up on is
    // forgotten, and a node whose queue is full is not queued more.
    let broker = ConfigBroker::default();
    let _n1 = broker.attach(&node("n1"));
    let started = tokio::time::Instant::now();
    assert_eq!(
        broker.ask(&node("n1"), "c").await,
        Err(AskError::Timeout(node("n1")))
    );
    assert_eq!(started.elapsed(), CONFIG_TIMEOUT);
    assert!(broker.pending() == 0);
    // The unanswered request still sits in the node's queue; fill the rest of it.
    for _ in 1..CONFIG_QUEUE_PER_NODE {
        let _ = broker.ask(&node("n1"), "c").await;
    }
    assert_eq!(broker.ask(&node("n1"), "c").await, Err(AskError::Busy));
}

#[tokio::test(start_paused = true)]
async fn a_session_that_ends_fails_what_was_asked_of_it() {
    // Goal: an asker learns at once that the node went away, rather than at the timeout.
    let broker = std::sync::Arc::new(ConfigBroker::default());
    let n1 = broker.attach(&node("n1"));
    let asking = {
        let broker = std::sync::Arc::clone(&broker);
        tokio::spawn(async move { broker.ask(&node("n1"), "c").await })
    };
    while broker.pending() == 0 {
        tokio::task::yield_now().await;
    }
    drop(n1);
    broker.detach(&node("n1"));
    assert_eq!(asking.await.unwrap(), Err(AskError::Gone(node("n1"))));
    assert_eq!(
        broker.ask(&node("n1"), "c").await,
        Err(AskError::NotConnected(node("n1")))
    );
}
