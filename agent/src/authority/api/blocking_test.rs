//! Which entries move which index, and how a held request returns: on a change, at once
//! for an index that is not the current one, and at its wait (with jitter) otherwise. The
//! waits run in tokio's paused time, so they are measured exactly.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use waymark_core::model::ServiceName;
use waymark_core::view::{Endpoints, Markers, ReleasedView, Version, View, ViewKey};
use waymark_registry::machine::{Request, Response};
use waymark_registry::state::{Applied, Command, Stamped};

use super::*;

fn name(s: &str) -> ServiceName {
    s.parse().unwrap()
}

/// A registry entry whose one command applied as `applied`.
fn registry(applied: Applied) -> (Request, Response) {
    let stamped = Stamped {
        at_ms: 0,
        command: Command::RestartLeases,
    };
    (
        Request::Registry(stamped),
        Response::Registry {
            outcome: Ok(applied),
        },
    )
}

/// A release entry that put a view of `service` in force.
fn release(service: &str) -> (Request, Response) {
    let view = ReleasedView {
        version: Version(1),
        view: View {
            key: ViewKey {
                service: name(service),
                zone: "a".parse().unwrap(),
            },
            endpoints: Endpoints::new(),
            markers: Markers::default(),
        },
    };
    (
        Request::Release { releases: vec![] },
        Response::Released {
            views: vec![view],
            skipped: 0,
        },
    )
}

fn audit() -> (Request, Response) {
    (
        Request::Audit { entries: vec![] },
        Response::Audited { last_seq: 1 },
    )
}

fn apply(i: &mut Indices, index: u64, (request, response): (Request, Response)) -> bool {
    i.handle_entry(index, &request, &response)
}

#[test]
fn each_entry_moves_only_the_indices_of_what_it_changed() {
    // Goal: a route's index follows the parts of the state it reads, and nothing else.
    let (web, pay) = (name("web"), name("pay"));
    let mut i = Indices::at(10);
    for reads in [
        Reads::Services,
        Reads::Service,
        Reads::Instances,
        Reads::Views(&web),
    ] {
        assert_eq!(i.index(reads), 10);
    }
    // A registration: instances (and the services list, which counts them).
    let registered = Applied::Registered {
        instance: "web-r1".parse().unwrap(),
        expires_at_ms: 1,
    };
    assert!(apply(&mut i, 11, registry(registered)));
    assert_eq!(i.index(Reads::Instances), 11);
    assert_eq!(i.index(Reads::Services), 11);
    assert_eq!(i.index(Reads::Service), 10);
    assert_eq!(i.index(Reads::Views(&web)), 10);
    // A new term's lease restart before any lease, an expiry of nothing, an audit record
    // and a policy change nothing a blocking route reads: nobody wakes.
    assert!(!apply(
        &mut i,
        12,
        registry(Applied::LeasesRestarted { extended: 0 })
    ));
    assert!(!apply(
        &mut i,
        12,
        registry(Applied::Retired { instances: vec![] })
    ));
    assert!(!apply(&mut i, 12, audit()));
    let policy = Applied::PolicySet {
        service: web.clone(),
    };
    assert!(!apply(&mut i, 13, registry(policy)));
    // A release of web: web's views, every view, the list; not pay's views.
    assert!(apply(&mut i, 14, release("web")));
    assert_eq!(i.index(Reads::Views(&web)), 14);
    assert_eq!(i.index(Reads::AllViews), 14);
    assert_eq!(i.index(Reads::Views(&pay)), 10);
    assert_eq!(i.index(Reads::Instances), 11);
    assert_eq!(i.index(Reads::InstancesAndViews), 14);
    assert_eq!(i.index(Reads::Services), 14);
    // Removing a service removes its views without a release: every view index moves,
    // and web's never goes back although its own entry is forgotten.
    let removed = Applied::ServiceRemoved {
        service: pay.clone(),
    };
    assert!(apply(&mut i, 15, registry(removed)));
    assert_eq!(i.index(Reads::Service), 15);
    assert_eq!(i.index(Reads::Views(&pay)), 15);
    assert_eq!(i.index(Reads::Views(&web)), 15);
    // An entry seen again (below what is held) moves nothing.
    assert!(!apply(&mut i, 14, release("web")));
}

#[test]
fn a_resync_raises_every_index_and_never_lowers_one() {
    let web = name("web");
    let mut i = Indices::at(5);
    assert!(apply(&mut i, 9, release("web")));
    // Older than what is held (a lagging event read after the state): nothing moves.
    assert!(!i.handle_resync(5));
    assert_eq!(i.index(Reads::Views(&web)), 9);
    assert!(i.handle_resync(20));
    for reads in [
        Reads::Services,
        Reads::Service,
        Reads::Instances,
        Reads::Views(&web),
        Reads::AllViews,
    ] {
        assert_eq!(i.index(reads), 20, "{reads:?}");
    }
}

#[test]
fn an_empty_member_answers_index_one_not_zero() {
    // Consul's rule: 0 means "do not block", so a client echoing it must never get 0.
    assert_eq!(Indices::at(0).index(Reads::Instances), 1);
}

#[test]
fn wait_defaults_clamps_and_refuses_what_does_not_parse() {
    let parse = |index, wait| Blocking::parse(index, wait);
    assert_eq!(parse(None, None).unwrap(), None);
    assert_eq!(parse(Some("0"), Some("10s")).unwrap(), None);
    let b = |index, wait| Some(Blocking { index, wait });
    assert_eq!(parse(Some("7"), None).unwrap(), b(7, WAIT_DEFAULT));
    assert_eq!(
        parse(Some("7"), Some("30s")).unwrap(),
        b(7, Duration::from_secs(30))
    );
    assert_eq!(parse(Some("7"), Some("0s")).unwrap(), b(7, WAIT_DEFAULT));
    assert_eq!(parse(Some("7"), Some("1h")).unwrap(), b(7, WAIT_MAX));
    for (index, wait, field, reason) in [
        (Some("7"), Some("soon"), "wait", "bad_wait"),
        (Some("7"), Some("-1s"), "wait", "bad_wait"),
        (None, Some("10"), "wait", "bad_wait"),
        (Some("seven"), None, "index", "bad_index"),
        (Some("-1"), None, "index", "bad_index"),
        (Some("18446744073709551616"), None, "index", "bad_index"),
    ] {
        let e = parse(index, wait).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            (e.reason.as_str(), e.field.as_deref()),
            (reason, Some(field)),
            "{index:?} {wait:?}"
        );
    }
}

#[test]
fn the_hold_is_the_wait_plus_at_most_a_sixteenth() {
    let b = Blocking {
        index: 1,
        wait: Duration::from_secs(160),
    };
    assert_eq!(b.hold(0), Duration::from_secs(160));
    for random in [1, 9_999, 10_000, u64::MAX] {
        let hold = b.hold(random);
        assert!(
            hold >= b.wait && hold < b.wait + Duration::from_secs(10),
            "{hold:?}"
        );
    }
    let tiny = Blocking {
        index: 1,
        wait: Duration::from_millis(10),
    };
    assert_eq!(tiny.hold(u64::MAX), Duration::from_millis(10));
}

fn indices(at: u64) -> (watch::Sender<Indices>, watch::Receiver<Indices>) {
    watch::channel(Indices::at(at))
}

#[tokio::test(start_paused = true)]
async fn a_held_request_returns_on_the_change_and_not_before() {
    let (tx, rx) = indices(10);
    let web = name("web");
    let blocking = Some(Blocking {
        index: 10,
        wait: Duration::from_secs(60),
    });
    let held = tokio::spawn({
        let web = web.clone();
        async move {
            let index = wait(&rx, Reads::Views(&web), blocking, None).await;
            (index, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Another service's release and an audit record do not release it.
    tx.send_if_modified(|i| apply(i, 11, release("pay")));
    tx.send_if_modified(|i| apply(i, 12, audit()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!held.is_finished(), "returned before its index changed");
    let changed_at = Instant::now();
    tx.send_if_modified(|i| apply(i, 13, release("web")));
    let (index, returned_at) = held.await.unwrap();
    assert_eq!(index, 13);
    assert_eq!(returned_at, changed_at, "returned late");
}

#[tokio::test(start_paused = true)]
async fn a_held_request_times_out_at_its_wait_with_the_same_index() {
    let (_tx, rx) = indices(10);
    let wait_for = Duration::from_secs(32);
    let blocking = Some(Blocking {
        index: 10,
        wait: wait_for,
    });
    let start = Instant::now();
    let index = wait(&rx, Reads::Instances, blocking, None).await;
    let waited = start.elapsed();
    assert_eq!(index, 10);
    assert!(
        waited >= wait_for && waited < wait_for + wait_for / JITTER_DIVISOR,
        "waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_index_that_is_not_the_current_one_returns_at_once() {
    // Behind (a change since) and ahead (from another member, or from before a restart):
    // both answer at once with the current index, so the client catches up or resets.
    let (_tx, rx) = indices(10);
    for asked in [3, 11, u64::MAX] {
        let start = Instant::now();
        let blocking = Some(Blocking {
            index: asked,
            wait: WAIT_MAX,
        });
        assert_eq!(wait(&rx, Reads::Instances, blocking, None).await, 10);
        assert_eq!(start.elapsed(), Duration::ZERO, "index {asked}");
    }
    // And without blocking, the current index.
    assert_eq!(wait(&rx, Reads::Instances, None, None).await, 10);
}
