//! The estate the authority benches load before they measure: the reference region's
//! 60,000 instances over 450 services (unless sized down), spread over three zones and
//! registered through the real API, `concurrency` requests in flight.
//!
//! The `n`th instance goes to service `n % services` and zone `(n / services) % 3`, at an
//! address of its own ([`fleet::address`]), so every bench that loads `count` instances
//! from 0 loads the same shape. What registering means is the caller's (`bench writes`
//! also loads etcd with the same records); the loader only hands out numbers and collects
//! what each registration left behind.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;

use crate::harness::fleet;

/// Zones the estate spreads over.
pub const ZONES: [&str; 3] = ["z1", "z2", "z3"];

/// Registrations in flight while loading (what `bench writes` has always used).
pub const LOAD_CONCURRENCY: usize = 64;

/// The `n`th instance of an estate over `services` services: its service, zone and
/// address.
pub fn spec(n: usize, services: usize) -> (String, &'static str, SocketAddr) {
    let services = services.max(1);
    (
        fleet::service_name(n % services),
        ZONES[(n / services) % ZONES.len()],
        fleet::address(n + 1),
    )
}

/// The `n`th of `count` instances over `services` services, loaded one service after
/// another (a fleet deployed service by service): instance `n` goes to service
/// `n * services / count` and zone `n % 3`. The estate is the same size and as evenly
/// spread as [`spec`]'s, but each admission window touches a few services rather than
/// every one, so the leader's releases while loading carry a few views each, not the whole
/// region's.
pub fn spec_by_service(
    n: usize,
    services: usize,
    count: usize,
) -> (String, &'static str, SocketAddr) {
    let service = n.saturating_mul(services.max(1)) / count.max(1);
    (
        fleet::service_name(service.min(services.max(1) - 1)),
        ZONES[n % ZONES.len()],
        fleet::address(n + 1),
    )
}

/// Registers `count` instances, numbered from `next` on (numbers are never reused, so a
/// later phase drawing from the same counter gets addresses of its own), with
/// `concurrency` calls of `add` in flight; every one must succeed. What each left behind,
/// in no particular order.
pub async fn load<T, F, Fut>(
    count: usize,
    concurrency: usize,
    next: &Arc<AtomicUsize>,
    add: F,
) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>> + Send,
{
    let left = Arc::new(AtomicUsize::new(count));
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (add, next, left) = (add.clone(), Arc::clone(next), Arc::clone(&left));
        workers.push(tokio::spawn(async move {
            let mut held = Vec::new();
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                .is_ok()
            {
                held.push(add(next.fetch_add(1, Ordering::Relaxed)).await?);
            }
            Ok::<_, anyhow::Error>(held)
        }));
    }
    let mut held = Vec::with_capacity(count);
    for w in workers {
        held.extend(w.await.context("a loading client panicked")??);
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estate_fills_every_service_in_each_zone_in_turn() {
        assert_eq!(spec(0, 450).0, "svc-00");
        assert_eq!(spec(449, 450).0, "svc-449");
        assert_eq!(
            (spec(450, 450).0.as_str(), spec(450, 450).1),
            ("svc-00", "z2")
        );
        assert_eq!(spec(3 * 450, 450).1, "z1");
        assert_ne!(spec(1, 450).2, spec(451, 450).2);
    }

    #[test]
    fn by_service_the_estate_is_as_even_and_fills_one_service_at_a_time() {
        let (services, count) = (450, 60_000);
        let mut per: std::collections::BTreeMap<String, [usize; 3]> = Default::default();
        for n in 0..count {
            let (s, z, _) = spec_by_service(n, services, count);
            let zone = ZONES.iter().position(|x| *x == z).unwrap();
            per.entry(s).or_default()[zone] += 1;
        }
        assert_eq!(per.len(), services);
        assert!(
            per.values()
                .all(|z| z.iter().all(|n| (44..=45).contains(n))),
            "{per:?}"
        );
        assert_eq!(spec_by_service(0, services, count).0, "svc-00");
        assert_eq!(spec_by_service(count - 1, services, count).0, "svc-449");
    }

    #[tokio::test]
    async fn the_loader_registers_exactly_the_count_asked_with_fresh_numbers() {
        let next = Arc::new(AtomicUsize::new(5));
        let mut got = load(100, 8, &next, |n| async move { Ok(n) }).await.unwrap();
        got.sort_unstable();
        assert_eq!(got, (5..105).collect::<Vec<_>>());
        assert_eq!(next.load(Ordering::Relaxed), 105);
    }
}
