//! Query strings: what each filter keeps, what is refused (naming the parameter), and pages
//! that walk every item once while items are inserted between them.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use waymark_core::contract::CapabilityProfile;
use waymark_core::eligibility::{EvidenceMode, Verdict};
use waymark_core::model::{Address, InstanceId};
use waymark_core::view::{Capability, ViewEndpoint};

use super::*;

const ALL: &[&str] = &[
    "index",
    "wait",
    "service",
    "tag",
    "zone",
    "verdict",
    "capability",
    "passing",
    "limit",
    "cursor",
];

fn parse(query: &str) -> Result<ListQuery, ApiError> {
    let uri: Uri = format!("/v1/instances?{query}").parse().unwrap();
    ListQuery::parse(&uri, ALL, Some(Walk::Instances))
}

fn refused(query: &str) -> (String, Option<String>) {
    let e = parse(query).unwrap_err();
    assert_eq!(e.status, StatusCode::BAD_REQUEST, "{query}");
    (e.reason, e.field)
}

fn endpoint(
    id: &str,
    zone: &str,
    verdict: Verdict,
    tags: &[&str],
    capability: Option<Capability>,
) -> ViewEndpoint {
    let mut e = ViewEndpoint::eligible(
        id.parse().unwrap(),
        Address {
            ip: "10.0.0.1".parse().unwrap(),
            port: 80,
        },
        "eu".parse().unwrap(),
        zone.parse().unwrap(),
    );
    e.verdict = verdict;
    e.tags = Arc::new(tags.iter().map(|t| (*t).to_owned()).collect());
    e.capability = capability;
    e
}

fn capability(verified: bool, evidence: EvidenceMode, profile: CapabilityProfile) -> Capability {
    Capability {
        profile,
        verified,
        evidence,
    }
}

#[test]
fn filters_keep_what_they_name() {
    let probed = capability(true, EvidenceMode::ProbePrimary, CapabilityProfile::FULL);
    let external = capability(
        false,
        EvidenceMode::SingleClass,
        CapabilityProfile::NO_READINESS,
    );
    let endpoints = [
        endpoint(
            "w1",
            "a",
            Verdict::Eligible,
            &["canary", "v2"],
            Some(probed),
        ),
        endpoint("w2", "b", Verdict::Degraded, &["v2"], Some(probed)),
        endpoint("w3", "a", Verdict::Unknown, &[], Some(external)),
        endpoint("w4", "b", Verdict::Eligible, &[], None),
    ];
    let kept = |query: &str| -> Vec<String> {
        let q = parse(query).unwrap();
        endpoints
            .iter()
            .filter(|e| q.filter.matches_endpoint(e))
            .map(|e| e.instance.to_string())
            .collect()
    };
    assert_eq!(kept(""), ["w1", "w2", "w3", "w4"]);
    assert_eq!(kept("tag=v2"), ["w1", "w2"]);
    // Repeated tags: every one must be carried.
    assert_eq!(kept("tag=v2&tag=canary"), ["w1"]);
    // Repeated zones and verdicts: any.
    assert_eq!(kept("zone=a"), ["w1", "w3"]);
    assert_eq!(kept("zone=a&zone=b"), ["w1", "w2", "w3", "w4"]);
    assert_eq!(kept("verdict=degraded&verdict=unknown"), ["w2", "w3"]);
    assert_eq!(kept("passing"), ["w1", "w4"]);
    assert_eq!(kept("passing=true&zone=b"), ["w4"]);
    assert_eq!(kept("passing=false"), ["w1", "w2", "w3", "w4"]);
    assert_eq!(kept("passing&verdict=degraded"), Vec::<String>::new());
    // Capability: an endpoint stating none (a peer region's) matches no capability.
    assert_eq!(kept("capability=verified"), ["w1", "w2"]);
    assert_eq!(kept("capability=unverified"), ["w3"]);
    assert_eq!(kept("capability=single_class"), ["w3"]);
    assert_eq!(kept("capability=probe"), ["w1", "w2"]);
    assert_eq!(kept("capability=passive"), ["w1", "w2", "w3"]);
    assert!(!parse("").unwrap().filter.reads_views());
    assert!(!parse("tag=a&zone=b").unwrap().filter.reads_views());
    for q in ["passing", "verdict=withdrawn", "capability=verified"] {
        assert!(parse(q).unwrap().filter.reads_views(), "{q}");
    }
}

#[test]
fn bad_parameters_are_refused_naming_them() {
    for (query, reason, field) in [
        ("colour=red", "unknown_parameter", Some("colour")),
        ("tags=a", "unknown_parameter", Some("tags")),
        ("verdict=healthy", "unknown_value", Some("verdict")),
        ("capability=magic", "unknown_value", Some("capability")),
        ("passing=yes", "unknown_value", Some("passing")),
        ("tag=", "unknown_value", Some("tag")),
        ("zone=a%20b", "bad_name", Some("zone")),
        ("service=we%2Fb", "bad_name", Some("service")),
        (
            "service=web&service=pay",
            "repeated_parameter",
            Some("service"),
        ),
        ("index=1&index=2", "repeated_parameter", Some("index")),
        ("index=x", "bad_index", Some("index")),
        ("index=1&wait=forever", "bad_wait", Some("wait")),
        ("limit=0", "bad_limit", Some("limit")),
        ("limit=1001", "bad_limit", Some("limit")),
        ("limit=ten", "bad_limit", Some("limit")),
        ("cursor=zz", "bad_cursor", Some("cursor")),
        ("limit=5&cursor=00", "bad_cursor", Some("cursor")),
        ("cursor=69313a77", "bad_limit", Some("limit")),
    ] {
        assert_eq!(
            refused(query),
            (reason.to_owned(), field.map(str::to_owned)),
            "{query}"
        );
    }
    // A cursor from another route's walk is not this route's.
    let services = encode_cursor(Walk::Services, "web");
    assert_eq!(
        refused(&format!("limit=5&cursor={services}")).0,
        "bad_cursor"
    );
    // More values than a filter takes.
    let many: Vec<String> = (0..=FILTER_VALUES_MAX)
        .map(|i| format!("tag=t{i}"))
        .collect();
    assert_eq!(
        refused(&many.join("&")),
        ("too_many".to_owned(), Some("tag".to_owned()))
    );
    // A route refuses what it does not take, and pages where it walks nothing.
    let uri: Uri = "/v1/services/web?limit=5".parse().unwrap();
    let e = ListQuery::parse(&uri, &["index", "wait"], None).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("limit"));
}

#[test]
fn pages_walk_every_item_once_while_items_are_inserted() {
    // Goal: an item present throughout the walk is seen exactly once, whatever is inserted
    // between pages (before the cursor, after it, or at its very next key).
    let mut items: BTreeMap<String, ()> = (0..25).map(|i| (format!("web-r{i:03}"), ())).collect();
    let present: BTreeSet<String> = items.keys().cloned().collect();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let query = match &cursor {
            None => "limit=4".to_owned(),
            Some(c) => format!("limit=4&cursor={c}"),
        };
        let q = parse(&query).unwrap();
        let (page, next) = paginate(
            items.keys().map(|k| (k.as_str(), k.clone())),
            q.page.as_ref(),
            Walk::Instances,
        );
        assert!(page.len() <= 4);
        seen.extend(page);
        pages += 1;
        // Inserts between pages: before every key, in the middle, after every key.
        items.insert(format!("web-r{:03}a", pages), ());
        items.insert(format!("aaa-{pages}"), ());
        items.insert(format!("zzz-{pages}"), ());
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 100, "the walk does not end");
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "an item was seen twice: {seen:?}");
    for id in &present {
        assert!(unique.contains(id), "{id} was skipped");
    }
    // Without a limit, everything, and no cursor.
    let q = parse("").unwrap();
    let (all, next) = paginate(
        items.keys().map(|k| (k.as_str(), ())),
        q.page.as_ref(),
        Walk::Instances,
    );
    assert_eq!((all.len(), next), (items.len(), None));
}

#[test]
fn the_last_page_names_no_next_cursor() {
    let ids: Vec<InstanceId> = ["a", "b", "c", "d"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let walk = |query: &str| {
        let q = parse(query).unwrap();
        paginate(
            ids.iter().map(|id| (id.as_str(), id.to_string())),
            q.page.as_ref(),
            Walk::Instances,
        )
    };
    let (page, next) = walk("limit=2");
    assert_eq!(page, ["a", "b"]);
    let next = next.unwrap();
    let (page, last) = walk(&format!("limit=2&cursor={next}"));
    assert_eq!((page, last), (vec!["c".to_owned(), "d".to_owned()], None));
}
