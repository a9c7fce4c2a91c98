//! The node agent's evidence session with the authority: says hello (its zone), receives
//! its probe targets, and sends what it has to report — probe results, relayed
//! self-reports, aggregated load reports. One session at a time, to any authority member,
//! reconnecting with jittered backoff; the leader's refusal (another member leads) is just
//! another reason to move on.
//!
//! Evidence is a rate, not a log: while no session is open, what would have been sent is
//! dropped and counted (the authority sees silence, which never removes anything).
//!
//! The same session carries the node's sidecar report (see `sidecars.rs`): the latest one
//! as soon as the session opens, then each one the reporter publishes; and it answers the
//! authority's config requests about one sidecar from the local xDS server, and its
//! keyring requests (online gossip key rotation) from the live gossip keyring.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tonic::transport::Endpoint;
use waymark_core::model::ZoneName;
use waymark_xds::client::{Backoff, BackoffConfig};

use super::metrics::AgentMetrics;
use super::probe::Prober;
use super::sidecars::{self, SidecarFeed};
use crate::evidence::{
    AgentMessage, AuthorityMessage, ClientConfig, ClientSession, KeyringAnswer, KeyringOutcome,
    KeyringRequest, WireSample,
};
use crate::gossip::GossipKeyring;

/// Samples per message, at most (well under the authority's batch limit).
const BATCH: usize = 512;
/// How long samples may wait to be batched.
const LINGER: Duration = Duration::from_millis(100);

/// Where and how to connect.
#[derive(Clone)]
pub struct SessionConfig {
    /// Authority members' ingest listeners (`host:port`).
    pub members: Vec<String>,
    /// This node's zone.
    pub zone: ZoneName,
    /// Mutual TLS (the node's identity is the reporter); `None` is plain text.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Jitter seed.
    pub seed: u64,
    /// The live gossip keyring the authority's keyring requests change; `None` when this
    /// node does not gossip (such requests are answered `no_gossip`).
    pub keyring: Option<GossipKeyring>,
    /// Trace export: a span per evidence batch sent (see `crate::otel`).
    pub telemetry: crate::otel::Telemetry,
}

/// Run the session until `outbound` closes. Samples from the prober arrive on `probes`;
/// anything else already framed on `outbound`.
pub(crate) async fn run(
    config: SessionConfig,
    prober: Prober,
    mut probes: mpsc::Receiver<WireSample>,
    mut outbound: mpsc::Receiver<AgentMessage>,
    metrics: AgentMetrics,
    mut feed: SidecarFeed,
) {
    if config.members.is_empty() {
        tracing::warn!("no ingest members configured; probe results and reports are dropped");
        loop {
            tokio::select! {
                s = probes.recv() => if s.is_none() { return } else { metrics.evidence_dropped.inc(); },
                m = outbound.recv() => if m.is_none() { return } else { metrics.evidence_dropped.inc(); },
            }
        }
    }
    let mut backoff = Backoff::new(BackoffConfig::default(), config.seed);
    let mut next = (config.seed as usize) % config.members.len();
    loop {
        let member = config.members[next % config.members.len()].clone();
        next += 1;
        let opened = tokio::time::Instant::now();
        let outcome = session(
            &config,
            &member,
            &prober,
            &mut probes,
            &mut outbound,
            &metrics,
            &mut feed,
        )
        .await;
        metrics.evidence_connected.set(0);
        let error = match outcome {
            Ok(()) => return,
            Err(e) => e,
        };
        let delay = backoff.next_delay(opened.elapsed(), None);
        tracing::info!(%member, %error, backoff_ms = delay.as_millis() as u64, "evidence session ended; reconnecting");
        // Keep draining while away: what cannot be sent is dropped, never queued.
        let deadline = tokio::time::sleep(delay);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => break,
                s = probes.recv() => match s { Some(_) => metrics.evidence_dropped.inc(), None => return },
                m = outbound.recv() => match m { Some(_) => metrics.evidence_dropped.inc(), None => return },
            };
        }
    }
}

/// One session; `Ok` when the inputs closed (the agent stops).
async fn session(
    config: &SessionConfig,
    member: &str,
    prober: &Prober,
    probes: &mut mpsc::Receiver<WireSample>,
    outbound: &mut mpsc::Receiver<AgentMessage>,
    metrics: &AgentMetrics,
    feed: &mut SidecarFeed,
) -> Result<(), String> {
    // `http://` even over TLS: the connector does the handshake.
    let endpoint = Endpoint::from_shared(format!("http://{member}"))
        .map_err(|e| format!("bad ingest address {member}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let channel = match &config.tls {
        Some(tls) => endpoint
            .connect_with_connector(waymark_certs::grpc::TlsConnector::new(Arc::clone(tls)))
            .await
            .map_err(|e| format!("connect: {e:?}"))?,
        None => endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?,
    };
    let mut s = ClientSession::open(channel)
        .await
        .map_err(|e| format!("open: {e}"))?;
    s.send(AgentMessage::Hello {
        zone: config.zone.clone(),
    })
    .await
    .map_err(|e| e.to_string())?;
    metrics.evidence_connected.set(1);
    tracing::info!(%member, "evidence session open");
    // A new session (perhaps a new leader) knows nothing of the sidecars: tell it now.
    let report = feed.reports.borrow_and_update().clone();
    s.send(AgentMessage::Sidecars { report })
        .await
        .map_err(|e| e.to_string())?;
    let mut reporting = true;
    let mut batch: Vec<WireSample> = Vec::new();
    let linger = tokio::time::sleep(LINGER);
    tokio::pin!(linger);
    loop {
        tokio::select! {
            msg = s.inbound.next() => match msg {
                Some(Ok(AuthorityMessage::Assignment { targets })) => {
                    tracing::info!(targets = targets.len(), "probe assignment received");
                    prober.set_targets(targets);
                }
                Some(Ok(AuthorityMessage::Ack { accepted, refused })) => {
                    metrics.evidence_accepted.inc_by(accepted);
                    metrics.evidence_refused.inc_by(refused.len() as u64);
                    for r in refused.iter().take(3) {
                        tracing::debug!(instance = %r.instance, reason = %r.reason, "sample refused");
                    }
                }
                Some(Ok(AuthorityMessage::ConfigRequest(request))) => {
                    let now = tokio::time::Instant::now();
                    let document = sidecars::config(&feed.shared, &request.client, now);
                    tracing::debug!(client = %request.client, found = document.is_some(), "config request answered");
                    let answer = ClientConfig { request_id: request.request_id, document };
                    s.send(AgentMessage::ClientConfig(answer)).await.map_err(|e| e.to_string())?;
                }
                Some(Ok(AuthorityMessage::KeyringRequest(request))) => {
                    let answer = keyring_answer(config.keyring.as_ref(), request).await;
                    s.send(AgentMessage::KeyringAnswer(answer)).await.map_err(|e| e.to_string())?;
                }
                Some(Err(status)) => return Err(format!("authority: {status}")),
                None => return Err("authority closed the session".into()),
            },
            changed = feed.reports.changed(), if reporting => match changed {
                Ok(()) => {
                    let report = feed.reports.borrow_and_update().clone();
                    s.send(AgentMessage::Sidecars { report }).await.map_err(|e| e.to_string())?;
                }
                // The reporter stopped (the agent is stopping): nothing more to say.
                Err(_) => reporting = false,
            },
            sample = probes.recv() => match sample {
                Some(sample) => {
                    if batch.is_empty() {
                        linger.as_mut().reset(tokio::time::Instant::now() + LINGER);
                    }
                    batch.push(sample);
                    if batch.len() >= BATCH {
                        let samples = std::mem::take(&mut batch);
                        send_samples(&s, samples, config).await?;
                    }
                }
                None => return Ok(()),
            },
            () = &mut linger, if !batch.is_empty() => {
                let samples = std::mem::take(&mut batch);
                send_samples(&s, samples, config).await?;
            }
            message = outbound.recv() => match message {
                Some(m) => s.send(m).await.map_err(|e| e.to_string())?,
                None => return Ok(()),
            },
        }
    }
}

/// Applies a keyring request to the live keyring (persisted before it is in force).
/// Send one batch of samples, as one span (`waymark.evidence.send`); the authority's
/// admission of it is `waymark.evidence.admit`, joined by reporter and count.
async fn send_samples(
    s: &ClientSession,
    samples: Vec<WireSample>,
    config: &SessionConfig,
) -> Result<(), String> {
    let mut span = config.telemetry.span(
        "waymark.evidence.send",
        None,
        &[],
        vec![
            opentelemetry::KeyValue::new("waymark.samples", samples.len() as i64),
            opentelemetry::KeyValue::new("waymark.zone", config.zone.to_string()),
        ],
    );
    let sent = s
        .send(AgentMessage::Samples { samples })
        .await
        .map_err(|e| e.to_string());
    if let Err(error) = &sent {
        span.fail(error.clone());
    }
    span.end();
    sent
}

async fn keyring_answer(keyring: Option<&GossipKeyring>, request: KeyringRequest) -> KeyringAnswer {
    let outcome = match keyring {
        Some(k) => KeyringOutcome::of(k.apply(request.op).await),
        None => KeyringOutcome::refused("no_gossip", "this node agent runs no gossip"),
    };
    KeyringAnswer {
        request_id: request.request_id,
        outcome,
    }
}
