//! Trace export: the spans that matter, sent to an OpenTelemetry collector over OTLP.
//!
//! Off unless the standard `OTEL_*` variables ask for it (`OTEL_TRACES_EXPORTER=otlp`, or
//! an `OTEL_EXPORTER_OTLP_ENDPOINT`/`_TRACES_ENDPOINT`). [`OtelSettings::from_env`] reads
//! them from a map, not the process environment, so a role takes its settings as a value
//! and tests run several roles in one process; a bad value is refused at start naming the
//! variable ([`OtelError`]).
//!
//! ```text
//! role shell ──span──► QueueProcessor ──bounded queue──► export task ──OTLP──► collector
//!                       (full: dropped, counted)          (failure: logged once, next batch retries)
//! ```
//!
//! Exporting never blocks or stops a role: ended spans go into a bounded queue
//! (`OTEL_BSP_MAX_QUEUE_SIZE`) with `try_send`; a full queue drops the span and counts it
//! (`waymark_otel_spans_dropped_total`, [`Telemetry::dropped_spans`], and a `trace spans
//! dropped` warning at most every 10 s);
//! an export task on the role's runtime sends batches, and an unreachable collector is
//! logged once (and once more when it answers again), its batch counted as dropped, the
//! next batch trying again.
//!
//! Spans are per decision, never per endpoint, so their number does not grow with the
//! estate: one per evaluation that released views, per release, per Raft commit of
//! releases, per xDS delivery of a committed entry, per evidence batch, and per release
//! and hop from its send to its last client's acknowledgement (`waymark.xds.ack`, see
//! [`AckSpans`]); counts and versions ride as attributes (names under `waymark.`).
//!
//! How a withdrawal's trace holds together: inside the authority the spans are parent and
//! child (evaluate → release → raft.commit → xds.publish), joined by the view version —
//! [`Telemetry::remember`] keeps each released version's span context (bounded) so the
//! publisher and the xDS tier, which receive views, not spans, find their parent. Across
//! the xDS hop the trace context is *not* propagated: the Delta xDS response has no field
//! for it that Envoy would ignore (a `traceparent` folded into the nonce would reach the
//! other implementations' clients too, and the sidecar hop is Envoy's), so the node agent's
//! spans carry the same `waymark.view.version` attribute and are joined by it in the
//! collector. On the evidence path the agent's send and the authority's admission are
//! joined by reporter and count, and each release's evaluation links to the admissions
//! since the release before it (`authority::hub`).

mod acks;
pub use acks::{ACK_WAIT_MAX, AckLedger, AckOutcome, AckSpans, OPEN_MAX};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanKind, TraceContextExt as _, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// The service name of the authority role when `OTEL_SERVICE_NAME` is unset.
pub const AUTHORITY_SERVICE: &str = "waymark-authority";
/// The service name of the node agent role when `OTEL_SERVICE_NAME` is unset.
pub const AGENT_SERVICE: &str = "waymark-agent";
/// Span contexts [`Telemetry::remember`] keeps at most (the oldest are forgotten).
pub const REMEMBERED_MAX: usize = 4_096;
/// Links one span carries at most (a commit of many releases links the first few).
pub const LINKS_MAX: usize = 16;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_QUEUE: usize = 2_048;
const DEFAULT_BATCH: usize = 512;
const DEFAULT_DELAY: Duration = Duration::from_secs(5);
const DROP_REPORT_EVERY: Duration = Duration::from_secs(10);

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtelProtocol {
    /// OTLP/gRPC (`grpc`), the default: the same tonic stack as xDS.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`).
    HttpProtobuf,
}

/// Which spans are kept (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OtelSampler {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio` with its ratio.
    Ratio(f64),
    /// `parentbased_always_on` (the default).
    ParentAlwaysOn,
    /// `parentbased_always_off`.
    ParentAlwaysOff,
    /// `parentbased_traceidratio` with its ratio.
    ParentRatio(f64),
}

/// Trace export, as the `OTEL_*` variables configure it.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelSettings {
    /// gRPC or HTTP/protobuf.
    pub protocol: OtelProtocol,
    /// Where spans go: for gRPC the collector's base URL, for HTTP the full URL of
    /// `/v1/traces`.
    pub endpoint: String,
    /// `OTEL_SERVICE_NAME`; unset, the role's name ([`AUTHORITY_SERVICE`], [`AGENT_SERVICE`]).
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order.
    pub resource: Vec<(String, String)>,
    /// The sampler.
    pub sampler: OtelSampler,
    /// `OTEL_EXPORTER_OTLP_HEADERS` then `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (the latter wins).
    pub headers: BTreeMap<String, String>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`, ms; default 10 s).
    pub timeout: Duration,
    /// Ended spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048).
    pub queue_max: usize,
    /// Spans per export at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, default 512).
    pub batch_max: usize,
    /// How long a batch waits to fill (`OTEL_BSP_SCHEDULE_DELAY`, ms; default 5 s).
    pub schedule_delay: Duration,
    /// TLS towards an `https://` collector (gRPC only): the roots that verify it, and a
    /// client certificate to present, from `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`,
    /// `_CLIENT_CERTIFICATE` and `_CLIENT_KEY` (PEM files, read at start). `None` for
    /// `http://`.
    pub tls: Option<OtelTls>,
}

/// TLS settings for an `https://` collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelTls {
    /// PEM roots the collector's certificate must chain to. Required: trace export trusts
    /// what it is told to, never the host's whole store.
    pub ca: std::path::PathBuf,
    /// A client certificate chain and key (PEM) for a collector that wants mutual TLS.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A refused `OTEL_*` value; nothing started. The role should stop with it at start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// A variable holds a value this build does not accept; fix or unset it.
    #[error("{variable}: {value:?} {reason}")]
    BadValue {
        /// The variable's name.
        variable: &'static str,
        /// What it held.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// The exporter could not be built (a bug or an unusable endpoint).
    #[error("the OTLP exporter could not be built: {0}")]
    Exporter(String),
}

impl OtelSettings {
    /// The settings the `OTEL_*` entries of `vars` ask for; `None` when trace export is
    /// off (nothing asks for it, `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`).
    /// Other variables are ignored, so `std::env::vars()` may be passed whole.
    pub fn from_env<I, K, V>(vars: I) -> Result<Option<Self>, OtelError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let env: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .filter(|(k, v): &(String, String)| k.starts_with("OTEL_") && !v.trim().is_empty())
            .collect();
        let get = |name: &str| env.get(name).map(|v| v.trim().to_owned());
        if let Some(v) = get("OTEL_SDK_DISABLED") {
            match v.to_ascii_lowercase().as_str() {
                "true" => return Ok(None),
                "false" => {}
                _ => return Err(bad("OTEL_SDK_DISABLED", &v, "is not `true` or `false`")),
            }
        }
        let traces_endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base_endpoint = get("OTEL_EXPORTER_OTLP_ENDPOINT");
        match get("OTEL_TRACES_EXPORTER").as_deref() {
            Some("none") => return Ok(None),
            Some("otlp") => {}
            Some(other) => {
                return Err(bad(
                    "OTEL_TRACES_EXPORTER",
                    other,
                    "is not supported (`otlp` or `none`)",
                ));
            }
            None if traces_endpoint.is_none() && base_endpoint.is_none() => return Ok(None),
            None => {}
        }
        let (protocol_var, protocol) = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(p) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(p)),
            None => (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                get("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
        };
        let protocol = match protocol.as_deref() {
            None | Some("grpc") => OtelProtocol::Grpc,
            Some("http/protobuf") => OtelProtocol::HttpProtobuf,
            Some(other) => {
                return Err(bad(
                    protocol_var,
                    other,
                    "is not supported (`grpc` or `http/protobuf`)",
                ));
            }
        };
        let endpoint = match (traces_endpoint, base_endpoint) {
            (Some(e), _) => checked_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e)?,
            (None, Some(e)) => {
                let e = checked_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", e)?;
                match protocol {
                    OtelProtocol::Grpc => e,
                    OtelProtocol::HttpProtobuf => format!("{}/v1/traces", e.trim_end_matches('/')),
                }
            }
            (None, None) => match protocol {
                OtelProtocol::Grpc => "http://localhost:4317".to_owned(),
                OtelProtocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_owned(),
            },
        };
        let tls = if endpoint.starts_with("https://") {
            let endpoint_var = if get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            } else {
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            };
            if protocol == OtelProtocol::HttpProtobuf {
                return Err(bad(
                    endpoint_var,
                    &endpoint,
                    "uses TLS, which the http/protobuf exporter does not support here: \
                     use OTEL_EXPORTER_OTLP_PROTOCOL=grpc (or a local collector over http)",
                ));
            }
            let traces_or = |traces: &'static str, base: &'static str| {
                get(traces)
                    .map(|v| (traces, v))
                    .or_else(|| get(base).map(|v| (base, v)))
            };
            let Some((_, ca)) = traces_or(
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
            ) else {
                return Err(bad(
                    endpoint_var,
                    &endpoint,
                    "uses TLS: name the collector's CA (PEM) in OTEL_EXPORTER_OTLP_CERTIFICATE",
                ));
            };
            let cert = traces_or(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            );
            let key = traces_or(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            );
            let client = match (cert, key) {
                (Some((_, c)), Some((_, k))) => Some((c.into(), k.into())),
                (None, None) => None,
                (Some((var, v)), None) => {
                    return Err(bad(
                        var,
                        &v,
                        "needs OTEL_EXPORTER_OTLP_CLIENT_KEY beside it",
                    ));
                }
                (None, Some((var, v))) => {
                    return Err(bad(
                        var,
                        &v,
                        "needs OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE beside it",
                    ));
                }
            };
            Some(OtelTls {
                ca: ca.into(),
                client,
            })
        } else {
            None
        };
        let mut headers = BTreeMap::new();
        for var in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some(v) = get(var) {
                headers.extend(pairs(var, &v)?);
            }
        }
        let timeout = match get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
            Some(v) => millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", &v)?,
            None => match get("OTEL_EXPORTER_OTLP_TIMEOUT") {
                Some(v) => millis("OTEL_EXPORTER_OTLP_TIMEOUT", &v)?,
                None => DEFAULT_TIMEOUT,
            },
        };
        let queue_max = match get("OTEL_BSP_MAX_QUEUE_SIZE") {
            Some(v) => count("OTEL_BSP_MAX_QUEUE_SIZE", &v)?,
            None => DEFAULT_QUEUE,
        };
        let batch_max = match get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            Some(v) => count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &v)?,
            None => DEFAULT_BATCH.min(queue_max),
        };
        if batch_max > queue_max {
            return Err(bad(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                &batch_max.to_string(),
                "is larger than OTEL_BSP_MAX_QUEUE_SIZE",
            ));
        }
        let schedule_delay = match get("OTEL_BSP_SCHEDULE_DELAY") {
            Some(v) => millis("OTEL_BSP_SCHEDULE_DELAY", &v)?,
            None => DEFAULT_DELAY,
        };
        Ok(Some(Self {
            protocol,
            endpoint,
            service_name: get("OTEL_SERVICE_NAME"),
            resource: match get("OTEL_RESOURCE_ATTRIBUTES") {
                Some(v) => pairs("OTEL_RESOURCE_ATTRIBUTES", &v)?,
                None => Vec::new(),
            },
            sampler: sampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))?,
            headers,
            timeout,
            queue_max,
            batch_max,
            schedule_delay,
            tls,
        }))
    }
}

fn bad(variable: &'static str, value: &str, reason: &str) -> OtelError {
    OtelError::BadValue {
        variable,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

fn checked_endpoint(variable: &'static str, value: String) -> Result<String, OtelError> {
    let uri: http::Uri = value
        .parse()
        .map_err(|e| bad(variable, &value, &format!("is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(value),
        _ => Err(bad(
            variable,
            &value,
            "is not an http:// or https:// URL with a host",
        )),
    }
}

/// `key=value,key=value` with percent-encoded values (W3C baggage style).
fn pairs(variable: &'static str, value: &str) -> Result<Vec<(String, String)>, OtelError> {
    value
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(variable, value, "is not a list of key=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(bad(variable, value, "has an empty key"));
            }
            let v = percent_decode(v).ok_or_else(|| bad(variable, value, "has a bad %-escape"))?;
            Ok((k.to_owned(), v))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn millis(variable: &'static str, value: &str) -> Result<Duration, OtelError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms <= 3_600_000)
        .map(Duration::from_millis)
        .ok_or_else(|| {
            bad(
                variable,
                value,
                "is not a number of milliseconds (at most an hour)",
            )
        })
}

fn count(variable: &'static str, value: &str) -> Result<usize, OtelError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or_else(|| bad(variable, value, "is not a count from 1 to 1000000"))
}

fn sampler(name: Option<String>, arg: Option<String>) -> Result<OtelSampler, OtelError> {
    let ratio = || match &arg {
        None => Ok(1.0),
        Some(a) => a
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| bad("OTEL_TRACES_SAMPLER_ARG", a, "is not a ratio from 0 to 1")),
    };
    Ok(match name.as_deref() {
        None | Some("parentbased_always_on") => OtelSampler::ParentAlwaysOn,
        Some("always_on") => OtelSampler::AlwaysOn,
        Some("always_off") => OtelSampler::AlwaysOff,
        Some("traceidratio") => OtelSampler::Ratio(ratio()?),
        Some("parentbased_always_off") => OtelSampler::ParentAlwaysOff,
        Some("parentbased_traceidratio") => OtelSampler::ParentRatio(ratio()?),
        Some(other) => {
            return Err(bad(
                "OTEL_TRACES_SAMPLER",
                other,
                "is not a supported sampler (always_on, always_off, traceidratio, \
                 parentbased_always_on, parentbased_always_off, parentbased_traceidratio)",
            ));
        }
    })
}

impl OtelSampler {
    fn sdk(self) -> Sampler {
        match self {
            Self::AlwaysOn => Sampler::AlwaysOn,
            Self::AlwaysOff => Sampler::AlwaysOff,
            Self::Ratio(r) => Sampler::TraceIdRatioBased(r),
            Self::ParentAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            Self::ParentAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            Self::ParentRatio(r) => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r))),
        }
    }
}

/// A role's trace export: off (the default; every method a no-op) or an exporter. Clones
/// share it; the export task ends when the last clone is dropped.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    dropped: Counter,
    remembered: Mutex<Remembered>,
}

#[derive(Default)]
struct Remembered {
    by_version: HashMap<u64, SpanContext>,
    order: VecDeque<u64>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("on", &self.is_on())
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closes the queue; the export task sends what it holds and ends.
        let _ = self
            .provider
            .shutdown_with_timeout(Duration::from_millis(100));
    }
}

/// One span, or nothing when export is off. Ends when dropped or [`Spanned::end`]ed.
pub struct Spanned {
    span: Option<opentelemetry_sdk::trace::Span>,
}

impl Telemetry {
    /// Export off.
    pub fn off() -> Self {
        Self::default()
    }

    /// Export as `settings` say, under `settings.service_name` or `default_service`.
    /// Starts the export task on the current tokio runtime (call from inside one); `None`
    /// settings give [`Telemetry::off`].
    pub fn start(
        settings: Option<&OtelSettings>,
        default_service: &str,
    ) -> Result<Self, OtelError> {
        let Some(settings) = settings else {
            return Ok(Self::off());
        };
        let service = settings
            .service_name
            .clone()
            .unwrap_or_else(|| default_service.to_owned());
        let resource = Resource::builder_empty()
            .with_service_name(service.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .with_attributes(
                settings
                    .resource
                    .iter()
                    .filter(|(k, _)| k != "service.name")
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build();
        let mut exporter = build_exporter(settings)?;
        exporter.set_resource(&resource);
        let (tx, rx) = mpsc::channel(settings.queue_max);
        let dropped = Counter::default();
        tokio::spawn(export_loop(
            exporter,
            rx,
            settings.batch_max,
            settings.schedule_delay,
            dropped.clone(),
            settings.endpoint.clone(),
        ));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(QueueProcessor {
                tx: Mutex::new(Some(tx)),
                dropped: dropped.clone(),
            })
            .with_sampler(settings.sampler.sdk())
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("waymark");
        info!(service = %service, endpoint = %settings.endpoint, protocol = ?settings.protocol, "exporting traces");
        Ok(Self {
            inner: Some(Arc::new(Inner {
                provider,
                tracer,
                dropped,
                remembered: Mutex::new(Remembered::default()),
            })),
        })
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Spans dropped so far: the queue was full, or their batch failed to export.
    pub fn dropped_spans(&self) -> u64 {
        self.inner.as_ref().map_or(0, |i| i.dropped.get())
    }

    /// Export the dropped spans as `waymark_otel_spans_dropped_total` (only when export is
    /// on: a role that exports nothing has nothing to drop).
    pub fn register(&self, registry: &mut Registry) {
        if let Some(inner) = &self.inner {
            registry.register(
                "waymark_otel_spans_dropped",
                "Trace spans dropped: the export queue was full or the collector did not take their batch",
                inner.dropped.clone(),
            );
        }
    }

    /// Start a span now: a child of `parent` if given, else a new trace; linked to
    /// `links` (at most [`LINKS_MAX`]).
    pub fn span(
        &self,
        name: &'static str,
        parent: Option<&SpanContext>,
        links: &[SpanContext],
        attributes: Vec<KeyValue>,
    ) -> Spanned {
        self.span_from(name, None, parent, links, attributes)
    }

    /// [`Telemetry::span`] that began at `start` (a decision known to matter only once
    /// it has been made).
    pub fn span_from(
        &self,
        name: &'static str,
        start: Option<SystemTime>,
        parent: Option<&SpanContext>,
        links: &[SpanContext],
        attributes: Vec<KeyValue>,
    ) -> Spanned {
        let Some(inner) = &self.inner else {
            return Spanned { span: None };
        };
        let mut builder = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .with_links(
                links
                    .iter()
                    .filter(|l| l.is_valid())
                    .take(LINKS_MAX)
                    .map(|l| Link::with_context(l.clone()))
                    .collect(),
            );
        if let Some(start) = start {
            builder = builder.with_start_time(start);
        }
        let cx = match parent.filter(|p| p.is_valid()) {
            Some(p) => Context::new().with_remote_span_context(p.clone()),
            None => Context::new(),
        };
        Spanned {
            span: Some(inner.tracer.build_with_context(builder, &cx)),
        }
    }

    /// Keep `context` as the span that released each of `versions`, for the later
    /// stages that only see the views (bounded: the oldest are forgotten).
    pub fn remember(&self, versions: impl IntoIterator<Item = u64>, context: &SpanContext) {
        let Some(inner) = &self.inner else { return };
        if !context.is_valid() {
            return;
        }
        let mut r = inner
            .remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for v in versions {
            if r.by_version.insert(v, context.clone()).is_none() {
                r.order.push_back(v);
            }
        }
        while r.order.len() > REMEMBERED_MAX {
            if let Some(old) = r.order.pop_front() {
                r.by_version.remove(&old);
            }
        }
    }

    /// The span context remembered for `version`, if any.
    pub fn recall(&self, version: u64) -> Option<SpanContext> {
        let inner = self.inner.as_ref()?;
        inner
            .remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_version
            .get(&version)
            .cloned()
    }

    /// The distinct contexts remembered for `versions`, in first-seen order.
    pub fn recall_all(&self, versions: impl IntoIterator<Item = u64>) -> Vec<SpanContext> {
        let mut out: Vec<SpanContext> = Vec::new();
        for v in versions {
            if let Some(c) = self.recall(v)
                && !out.iter().any(|o| o.span_id() == c.span_id())
            {
                out.push(c);
            }
        }
        out
    }
}

impl Spanned {
    /// The span's context (invalid when export is off or the span was not sampled).
    pub fn context(&self) -> SpanContext {
        self.span
            .as_ref()
            .map_or_else(SpanContext::empty_context, |s| s.span_context().clone())
    }

    /// Add an attribute.
    pub fn set(&mut self, attribute: KeyValue) {
        if let Some(s) = &mut self.span {
            s.set_attribute(attribute);
        }
    }

    /// Mark the span failed with `message`.
    pub fn fail(&mut self, message: impl Into<String>) {
        if let Some(s) = &mut self.span {
            s.set_status(opentelemetry::trace::Status::error(message.into()));
        }
    }

    /// End the span now.
    pub fn end(mut self) {
        if let Some(mut s) = self.span.take() {
            s.end();
        }
    }
}

/// The gRPC exporter's TLS: the named roots only, and the client identity if any.
fn tls_config(tls: &OtelTls) -> Result<tonic::transport::ClientTlsConfig, OtelError> {
    let read = |variable: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            bad(
                variable,
                &path.display().to_string(),
                &format!("cannot be read: {e}"),
            )
        })
    };
    let ca = read("OTEL_EXPORTER_OTLP_CERTIFICATE", &tls.ca)?;
    let mut config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    if let Some((cert, key)) = &tls.client {
        let cert = read("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert)?;
        let key = read("OTEL_EXPORTER_OTLP_CLIENT_KEY", key)?;
        config = config.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    Ok(config)
}

fn build_exporter(settings: &OtelSettings) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    let built = match settings.protocol {
        OtelProtocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (k, v) in &settings.headers {
                let key =
                    tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                        .map_err(|_| {
                            bad("OTEL_EXPORTER_OTLP_HEADERS", k, "is not a header name")
                        })?;
                let value = v.parse().map_err(|_| {
                    bad(
                        "OTEL_EXPORTER_OTLP_HEADERS",
                        k,
                        "has a value that is not a header value",
                    )
                })?;
                metadata.insert(key, value);
            }
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_metadata(metadata);
            if let Some(tls) = &settings.tls {
                builder = builder.with_tls_config(tls_config(tls)?);
            }
            builder.build()
        }
        OtelProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.clone())
            .with_timeout(settings.timeout)
            .with_headers(settings.headers.clone().into_iter().collect())
            .build(),
    };
    built.map_err(|e| OtelError::Exporter(e.to_string()))
}

/// Ends spans into the bounded queue; never waits.
struct QueueProcessor {
    tx: Mutex<Option<mpsc::Sender<SpanData>>>,
    dropped: Counter,
}

impl std::fmt::Debug for QueueProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueProcessor").finish_non_exhaustive()
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = tx.as_ref().is_some_and(|tx| tx.try_send(span).is_ok());
        if !sent {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Ok(())
    }
}

/// Batches the queue and exports it until the queue closes. A failed export is logged
/// when the collector stops answering and when it answers again, not per batch.
async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
    batch_max: usize,
    delay: Duration,
    dropped: Counter,
    endpoint: String,
) {
    let mut failing = false;
    let mut reported = 0u64;
    let mut last_report = tokio::time::Instant::now();
    let mut batch = Vec::with_capacity(batch_max);
    loop {
        let Some(first) = rx.recv().await else { break };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + delay;
        let mut closed = false;
        while batch.len() < batch_max {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(span) => batch.push(span),
                    None => { closed = true; break }
                },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let spans = batch.len() as u64;
        match exporter.export(std::mem::take(&mut batch)).await {
            Ok(()) if failing => {
                failing = false;
                info!(%endpoint, "trace collector answers again");
            }
            Ok(()) => {}
            Err(error) => {
                dropped.inc_by(spans);
                if !failing {
                    failing = true;
                    warn!(%endpoint, %error, "exporting trace spans failed; dropping them and trying again with the next batch");
                }
            }
        }
        let total = dropped.get();
        if total > reported && last_report.elapsed() >= DROP_REPORT_EVERY {
            warn!(
                dropped_total = total,
                "trace spans dropped (queue full or collector unreachable)"
            );
            reported = total;
            last_report = tokio::time::Instant::now();
        }
        if closed {
            break;
        }
    }
}

#[cfg(test)]
mod tests;
