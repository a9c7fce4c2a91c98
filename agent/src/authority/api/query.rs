//! The query string of the read routes over services, instances and views: blocking
//! (`index`, `wait`, see [`super::blocking`]), filters (`service`, `tag`, `zone`, `verdict`,
//! `capability`, `passing`) and pages (`limit`, `cursor`). Each route names the parameters
//! it takes; any other is refused, as is a malformed value, with `400` naming the parameter
//! (a misspelt filter must not quietly answer with everything).
//!
//! Filters: within one parameter the values are alternatives, except `tag`, where every
//! value must be carried (as Consul's repeated `tag`); across parameters all must hold.
//! `passing` is Consul's shorthand for `verdict=eligible`.
//!
//! Pages walk the route's sort key (instance id, service name) in order. The cursor is an
//! opaque token naming the last key a page held, and the next page starts after it, so an
//! insert or a removal between two pages never shows an item twice or hides one that was
//! there throughout; without `limit` the route answers with everything, as before.

use std::collections::BTreeSet;

use axum::extract::Query;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::Response;
use waymark_core::eligibility::{EvidenceMode, Verdict};
use waymark_core::model::{EvidenceClass, ServiceName, ZoneName};
use waymark_core::view::ViewEndpoint;
use waymark_registry::state::InstanceRecord;

use super::ApiError;
use super::blocking::Blocking;

/// The most items one page may ask for (`limit`).
pub const LIMIT_MAX: usize = 1_000;
/// The most values one filter parameter may repeat.
pub const FILTER_VALUES_MAX: usize = 64;
/// The response header carrying the cursor of the next page, when there is one.
pub const NEXT_CURSOR_HEADER: &str = "x-waymark-next-cursor";

/// What a route's query string asked for.
#[derive(Debug, Default)]
pub(super) struct ListQuery {
    /// Hold the request for a change (`index`, `wait`).
    pub(super) blocking: Option<Blocking>,
    /// Only this service (`service`).
    pub(super) service: Option<ServiceName>,
    /// Which instances or endpoints.
    pub(super) filter: Filter,
    /// One page, when `limit` was given.
    pub(super) page: Option<Page>,
}

/// The filters on instances and endpoints.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Filter {
    /// Every one of these tags.
    tags: BTreeSet<String>,
    /// In one of these zones (any when empty).
    zones: BTreeSet<ZoneName>,
    /// With one of these verdicts (any when empty).
    verdicts: BTreeSet<VerdictFilter>,
    /// With one of these capabilities (any when empty).
    capabilities: BTreeSet<CapabilityFilter>,
    /// Only eligible ones (`passing`).
    passing: bool,
}

/// A verdict to filter on: the evaluator's, or `withdrawn` (registered, in no view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum VerdictFilter {
    Verdict(Verdict),
    Withdrawn,
}

/// A capability to filter on (`ViewEndpoint::capability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CapabilityFilter {
    /// Some evidence class speaks for it now (`verified`), or none does (`unverified`).
    Verified(bool),
    /// What its verdict rests on: `passive_primary`, `probe_primary`, `single_class`.
    Evidence(EvidenceMode),
    /// Its profile supplies this class: `probe`, `self_report`, `passive`.
    Class(EvidenceClass),
}

/// One page: at most `limit` items after the key the cursor names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Page {
    limit: usize,
    after: Option<String>,
}

/// Which sort key a route's cursor walks; a cursor from another route is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Walk {
    /// Instance ids (`GET /v1/instances`).
    Instances,
    /// Service names (`GET /v1/services`).
    Services,
}

impl Walk {
    fn tag(self) -> &'static str {
        match self {
            Self::Instances => "i1:",
            Self::Services => "s1:",
        }
    }
}

impl ListQuery {
    /// Parse `uri`'s query string for a route that takes the parameters `allowed` and walks
    /// `walk` (pages are refused when `walk` is `None`). Any refusal is a `400` naming the
    /// parameter.
    pub(super) fn parse(uri: &Uri, allowed: &[&str], walk: Option<Walk>) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_query",
                None,
                format!("the query string does not parse: {e}"),
            )
        })?;
        let mut single = Singles::default();
        let mut service = None;
        let mut q = Self::default();
        for (name, value) in &pairs {
            if !allowed.contains(&name.as_str()) {
                return Err(bad(
                    "unknown_parameter",
                    name,
                    format!(
                        "{name}: not a parameter of this route (it takes {})",
                        allowed.join(", ")
                    ),
                ));
            }
            match name.as_str() {
                "index" => once(&mut single.index, name, value)?,
                "wait" => once(&mut single.wait, name, value)?,
                "limit" => once(&mut single.limit, name, value)?,
                "cursor" => once(&mut single.cursor, name, value)?,
                "service" => {
                    once(&mut service, name, value)?;
                    q.service = Some(
                        value
                            .parse()
                            .map_err(|e| bad("bad_name", name, format!("service: {e}")))?,
                    );
                }
                _ => q.filter.add(name, value)?,
            }
        }
        q.blocking = Blocking::parse(single.index.as_deref(), single.wait.as_deref())?;
        q.page = Page::parse(single.limit.as_deref(), single.cursor.as_deref(), walk)?;
        Ok(q)
    }
}

/// The parameters that are read as they came, after the loop.
#[derive(Default)]
struct Singles {
    index: Option<String>,
    wait: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// A parameter that may appear once: a second one is refused rather than one of them
/// quietly winning.
fn once(slot: &mut Option<String>, name: &str, value: &str) -> Result<(), ApiError> {
    if slot.is_some() {
        return Err(bad(
            "repeated_parameter",
            name,
            format!("{name}: given more than once"),
        ));
    }
    *slot = Some(value.to_owned());
    Ok(())
}

fn bad(reason: &str, field: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, reason, Some(field), message)
}

// === impl Filter ===

impl Filter {
    /// Add one filter parameter's value.
    fn add(&mut self, name: &str, value: &str) -> Result<(), ApiError> {
        let unknown = |what: &str| {
            bad(
                "unknown_value",
                name,
                format!("{name}: {value:?} is not {what}"),
            )
        };
        let count = match name {
            "tag" => {
                if value.is_empty() {
                    return Err(unknown("a tag"));
                }
                self.tags.insert(value.to_owned());
                self.tags.len()
            }
            "zone" => {
                let zone = value
                    .parse()
                    .map_err(|e| bad("bad_name", name, format!("zone: {e}")))?;
                self.zones.insert(zone);
                self.zones.len()
            }
            "verdict" => {
                let verdict = VerdictFilter::parse(value).ok_or_else(|| {
                    unknown("a verdict (eligible, degraded, unknown, ineligible, quarantined, draining, withdrawn)")
                })?;
                self.verdicts.insert(verdict);
                self.verdicts.len()
            }
            "capability" => {
                let capability = CapabilityFilter::parse(value).ok_or_else(|| {
                    unknown("a capability (verified, unverified, passive_primary, probe_primary, single_class, probe, self_report, passive)")
                })?;
                self.capabilities.insert(capability);
                self.capabilities.len()
            }
            "passing" => {
                // `?passing` alone, as Consul's clients send it, or a boolean.
                self.passing = match value {
                    "" | "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err(unknown("a boolean (true, false, or none)")),
                };
                1
            }
            // A route that lists a parameter nothing reads: refused like any unknown one.
            _ => {
                return Err(bad(
                    "unknown_parameter",
                    name,
                    format!("{name}: not a parameter of this route"),
                ));
            }
        };
        if count > FILTER_VALUES_MAX {
            return Err(bad(
                "too_many",
                name,
                format!("{name}: more than {FILTER_VALUES_MAX} values"),
            ));
        }
        Ok(())
    }

    /// With no verdict asked for, only eligible ones (what Prometheus discovery serves by
    /// default).
    pub(super) fn or_passing(mut self) -> Self {
        if self.verdicts.is_empty() {
            self.passing = true;
        }
        self
    }

    /// Whether it needs what the views say (verdicts, capabilities) beyond the registry.
    pub(super) fn reads_views(&self) -> bool {
        self.passing || !self.verdicts.is_empty() || !self.capabilities.is_empty()
    }

    /// Whether a view's endpoint passes.
    pub(super) fn matches_endpoint(&self, e: &ViewEndpoint) -> bool {
        self.tags.iter().all(|t| e.tags.contains(t))
            && (self.zones.is_empty() || self.zones.contains(&e.zone))
            && self.verdict_passes(VerdictFilter::Verdict(e.verdict))
            && self.capability_passes(e)
    }

    /// Whether a registered instance passes, given its endpoint in this region's views
    /// (`None`: in no view, so `withdrawn`).
    pub(super) fn matches_instance(&self, r: &InstanceRecord, e: Option<&ViewEndpoint>) -> bool {
        let verdict = e.map_or(VerdictFilter::Withdrawn, |e| {
            VerdictFilter::Verdict(e.verdict)
        });
        self.tags.iter().all(|t| r.instance.tags.contains(t))
            && (self.zones.is_empty() || self.zones.contains(&r.instance.locality.zone))
            && self.verdict_passes(verdict)
            && (self.capabilities.is_empty() || e.is_some_and(|e| self.capability_passes(e)))
    }

    fn verdict_passes(&self, verdict: VerdictFilter) -> bool {
        (self.verdicts.is_empty() || self.verdicts.contains(&verdict))
            && (!self.passing || verdict == VerdictFilter::Verdict(Verdict::Eligible))
    }

    fn capability_passes(&self, e: &ViewEndpoint) -> bool {
        if self.capabilities.is_empty() {
            return true;
        }
        // An endpoint that states no capability (a peer region's) has none to match.
        let Some(c) = e.capability else {
            return false;
        };
        self.capabilities.iter().any(|f| match f {
            CapabilityFilter::Verified(v) => c.verified == *v,
            CapabilityFilter::Evidence(m) => c.evidence == *m,
            CapabilityFilter::Class(class) => c.profile.provides(*class),
        })
    }
}

impl VerdictFilter {
    fn parse(value: &str) -> Option<Self> {
        if value == "withdrawn" {
            return Some(Self::Withdrawn);
        }
        Verdict::ALL
            .into_iter()
            .find(|v| v.as_str() == value)
            .map(Self::Verdict)
    }
}

impl CapabilityFilter {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "verified" => return Some(Self::Verified(true)),
            "unverified" => return Some(Self::Verified(false)),
            _ => {}
        }
        if let Some(mode) = EvidenceMode::ALL.into_iter().find(|m| m.label() == value) {
            return Some(Self::Evidence(mode));
        }
        EvidenceClass::ALL
            .into_iter()
            .find(|c| c.as_str() == value)
            .map(Self::Class)
    }
}

// === impl Page ===

impl Page {
    fn parse(
        limit: Option<&str>,
        cursor: Option<&str>,
        walk: Option<Walk>,
    ) -> Result<Option<Self>, ApiError> {
        let Some(walk) = walk else {
            return Ok(None);
        };
        let after = cursor.map(|c| decode_cursor(walk, c)).transpose()?;
        let limit = match limit {
            None if after.is_some() => {
                return Err(bad(
                    "bad_limit",
                    "limit",
                    "limit: a cursor continues a paged walk, which needs its limit".into(),
                ));
            }
            None => return Ok(None),
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=LIMIT_MAX).contains(n))
                .ok_or_else(|| {
                    bad(
                        "bad_limit",
                        "limit",
                        format!("limit: {text:?} is not a whole number from 1 to {LIMIT_MAX}"),
                    )
                })?,
        };
        Ok(Some(Self { limit, after }))
    }
}

/// The opaque cursor naming `key` as the last item a page of `walk` held.
pub(super) fn encode_cursor(walk: Walk, key: &str) -> String {
    hex::encode(format!("{}{key}", walk.tag()))
}

fn decode_cursor(walk: Walk, cursor: &str) -> Result<String, ApiError> {
    let refuse = || {
        bad(
            "bad_cursor",
            "cursor",
            "cursor: not a cursor this route gave (pass X-Waymark-Next-Cursor as it came)".into(),
        )
    };
    let bytes = hex::decode(cursor).map_err(|_| refuse())?;
    let text = String::from_utf8(bytes).map_err(|_| refuse())?;
    let key = text.strip_prefix(walk.tag()).ok_or_else(refuse)?;
    // Keys are names (instance ids, service names): anything else was not given here.
    ServiceName::try_new(key).map_err(|_| refuse())?;
    Ok(key.to_owned())
}

/// The page of `items` (in key order, filters applied) that `page` asks for, and the cursor
/// of the next one when more follow; everything, and no cursor, without a page.
pub(super) fn paginate<'a, T>(
    items: impl Iterator<Item = (&'a str, T)>,
    page: Option<&Page>,
    walk: Walk,
) -> (Vec<T>, Option<String>) {
    let Some(page) = page else {
        return (items.map(|(_, item)| item).collect(), None);
    };
    let mut items = items
        .skip_while(|(key, _)| page.after.as_deref().is_some_and(|after| *key <= after))
        .peekable();
    let mut out = Vec::with_capacity(page.limit.min(LIMIT_MAX));
    let mut last = None;
    while out.len() < page.limit {
        let Some((key, item)) = items.next() else {
            break;
        };
        last = Some(key);
        out.push(item);
    }
    let next = match (items.peek(), last) {
        (Some(_), Some(last)) => Some(encode_cursor(walk, last)),
        _ => None,
    };
    (out, next)
}

/// `response` with `X-Waymark-Next-Cursor` when a next page exists.
pub(super) fn with_next(mut response: Response, next: Option<String>) -> Response {
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(&next)
    {
        response.headers_mut().insert(NEXT_CURSOR_HEADER, value);
    }
    response
}

#[cfg(test)]
#[path = "query_test.rs"]
mod tests;
