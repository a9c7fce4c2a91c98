//! Patched releases: a view committed as a patch is exactly the view released, a patch
//! never applies on another version than its base, and the encoder never patches against
//! a release whose fate it does not know.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};

use super::*;
use crate::machine::{AuthorityState, Request, Response, published_views};

fn key() -> ViewKey {
    ViewKey {
        service: "pay".parse().unwrap(),
        zone: "a".parse().unwrap(),
    }
}

pub(crate) fn endpoint(n: u8, weight: u32) -> ViewEndpoint {
    ViewEndpoint {
        instance: format!("pay-{n}").parse::<InstanceId>().unwrap(),
        address: Address {
            ip: std::net::IpAddr::from([10, 0, 0, n]),
            port: 8080,
        },
        region: "r1".parse().unwrap(),
        zone: "a".parse().unwrap(),
        tier: Tier::Local,
        priority: 0,
        weight: Weight::new(weight),
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

/// A release of the `pay`/`a` view holding `weights` (instance number → weight).
fn released(version: u64, weights: &BTreeMap<u8, u32>) -> ReleasedView {
    let mut view = View::empty(key());
    let map = &mut view.endpoints;
    for (&n, &w) in weights {
        let e = endpoint(n, w);
        map.insert(e.instance.clone(), e);
    }
    ReleasedView {
        version: Version(version),
        view,
    }
}

fn weights(pairs: &[(u8, u32)]) -> BTreeMap<u8, u32> {
    pairs.iter().copied().collect()
}

fn commit(state: &mut AuthorityState, enc: &mut ReleaseEncoder, view: &ReleasedView) -> Release {
    let release = enc.encode(view);
    let request = Request::Release {
        releases: vec![release.clone()],
    };
    let response = state.apply(request.clone());
    let patch = matches!(release, Release::Patch(_));
    enc.handle_committed(
        [(&view.view.key, patch)],
        published_views(&request, &response),
    );
    release
}

#[test]
fn the_first_release_is_whole_and_the_next_a_patch_that_makes_the_same_view() {
    let ten: BTreeMap<u8, u32> = (0..10).map(|n| (n, 100)).collect();
    let mut state = AuthorityState::default();
    let mut enc = ReleaseEncoder::new();
    let first = released(1, &ten);
    assert!(matches!(
        commit(&mut state, &mut enc, &first),
        Release::Whole(_)
    ));

    let mut next = ten.clone();
    next.insert(3, 50);
    next.remove(&7);
    let second = released(2, &next);
    let Release::Patch(patch) = commit(&mut state, &mut enc, &second) else {
        panic!("a two-endpoint change to a ten-endpoint view goes as a patch");
    };
    assert_eq!(patch.base, Version(1));
    assert_eq!(patch.delta.upserted.len(), 1);
    assert_eq!(patch.delta.removed.len(), 1);
    assert_eq!(state.published()[&key()], second);
    assert_eq!(state.max_version(), Version(2));
}

#[test]
fn a_patch_on_another_version_than_its_base_changes_nothing() {
    let mut state = AuthorityState::default();
    let held = released(5, &weights(&[(1, 100), (2, 100), (3, 100)]));
    state.apply(Request::Release {
        releases: vec![Release::Whole(held.clone())],
    });
    let patch = |base, version| {
        Release::Patch(ViewPatch {
            base: Version(base),
            version: Version(version),
            delta: waymark_core::view::diff(
                &held.view,
                &released(0, &weights(&[(1, 100), (2, 100)])).view,
            ),
        })
    };
    for (release, why) in [
        (patch(4, 6), "an older base"),
        (patch(6, 7), "a newer base"),
        (patch(5, 5), "no newer version"),
    ] {
        let before = state.clone();
        let response = state.apply(Request::Release {
            releases: vec![release],
        });
        assert_eq!(
            response,
            Response::Released {
                views: vec![],
                skipped: 1
            },
            "{why}"
        );
        assert_eq!(state, before, "{why}");
    }
    let mut other = key();
    other.zone = "b".parse().unwrap();
    let Release::Patch(mut unheld) = patch(5, 6) else {
        unreachable!()
    };
    unheld.delta.key = other;
    let before = state.clone();
    state.apply(Request::Release {
        releases: vec![Release::Patch(unheld)],
    });
    assert_eq!(state, before, "a patch of a view nothing holds");
}

#[test]
fn after_a_failed_write_or_a_skipped_patch_the_next_release_is_whole() {
    let eight: BTreeMap<u8, u32> = (1..=8).map(|n| (n, 100)).collect();
    let mut state = AuthorityState::default();
    let mut enc = ReleaseEncoder::new();
    commit(&mut state, &mut enc, &released(1, &eight));
    let mut next = eight.clone();
    next.insert(1, 10);
    let v2 = released(2, &next);
    assert!(matches!(enc.encode(&v2), Release::Patch(_)));
    enc.handle_failed([&key()]);
    assert!(
        matches!(enc.encode(&v2), Release::Whole(_)),
        "a write whose fate is unknown leaves nothing to patch against"
    );

    // The log holds another version than the encoder learnt (a failed write that did
    // commit): the patch is skipped, and what the encoder held is forgotten.
    commit(&mut state, &mut enc, &released(3, &eight));
    state.apply(Request::Release {
        releases: vec![Release::Whole(released(4, &next))],
    });
    next.insert(2, 10);
    let v5 = released(5, &next);
    let sent = commit(&mut state, &mut enc, &v5);
    assert!(matches!(sent, Release::Patch(_)));
    assert_eq!(state.published()[&key()].version, Version(4), "skipped");
    assert!(enc.held(&key()).is_none());
    assert!(matches!(
        commit(&mut state, &mut enc, &v5),
        Release::Whole(_)
    ));
    assert_eq!(state.published()[&key()], v5);
}

#[test]
fn a_change_to_most_of_a_view_goes_whole() {
    let mut state = AuthorityState::default();
    let mut enc = ReleaseEncoder::new();
    commit(
        &mut state,
        &mut enc,
        &released(1, &weights(&[(1, 100), (2, 100)])),
    );
    let v2 = released(2, &weights(&[(1, 50), (2, 100)]));
    assert!(matches!(enc.encode(&v2), Release::Whole(_)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever sequence of releases, write failures (committed or not) and replays: every
    /// member applying the log holds, after each committed entry, exactly the view the
    /// leader released last — the same state a log of whole views gives.
    #[test]
    fn patched_releases_hold_what_whole_releases_hold(
        steps in prop::collection::vec(
            (prop::collection::btree_map(0u8..12, 1u32..4, 0..12), 0u8..4),
            1..30,
        ),
    ) {
        let mut patched = AuthorityState::default();
        let mut whole = AuthorityState::default();
        let mut follower = AuthorityState::default();
        let mut enc = ReleaseEncoder::new();
        for (version, (weights, fate)) in (1u64..).zip(steps) {
            let view = released(version, &weights);
            let request = Request::Release { releases: vec![enc.encode(&view)] };
            // 0: committed and acknowledged; 1: failed but committed; 2: failed, lost.
            match fate {
                2 => enc.handle_failed([&view.view.key]),
                _ => {
                    let request_sent = request.clone();
                    let response = patched.apply(request.clone());
                    follower.apply(request);
                    if fate == 1 {
                        enc.handle_failed([&view.view.key]);
                    } else {
                        let put = published_views(
                            &Request::Release { releases: vec![] },
                            &response,
                        ).to_vec();
                        let patch = matches!(
                            &request_sent,
                            Request::Release { releases } if matches!(releases[..], [Release::Patch(_)])
                        );
                        enc.handle_committed([(&view.view.key, patch)], &put);
                    }
                    whole.apply(Request::Publish { views: vec![view.clone()] });
                    prop_assert_eq!(&patched.published()[&view.view.key], &view);
                }
            }
            prop_assert_eq!(patched.published(), follower.published());
        }
        // Every release that reached the log put its view in force: the patched log never
        // skipped one that a whole log applied.
        prop_assert_eq!(patched.published(), whole.published());
    }
}
