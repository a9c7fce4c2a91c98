//! A multi-member authority (Raft over redb) of `waymark authority` processes on loopback:
//! start every member, find the leader through the members' own `/v1/status`, SIGKILL a
//! member and restart it on the same data directory.
//!
//! The leader signal is a live member answering `/v1/status` with `is_leader: true`: a
//! member that only *believes* some other id leads is not enough, since a follower cut off
//! from a dead leader keeps naming it until its election timeout.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use waymark_agent::authority::config::LimitsSection;

use super::authority::{AuthorityProc, Voter};
use super::evidence::RegionPki;
use super::{free_port, loopback, wait_until};

/// How long one `/v1/status` may take before the member counts as not answering.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// What one member says about leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// The member asked.
    pub id: u64,
    /// The leader it knows of, if any.
    pub leader: Option<u64>,
    /// Whether it leads itself.
    pub is_leader: bool,
    /// Its Raft term.
    pub term: Option<u64>,
}

/// `n` authority members of one region, each with its own ports and data directory.
#[derive(Debug)]
pub struct AuthorityCluster {
    members: Vec<AuthorityProc>,
}

impl AuthorityCluster {
    /// Writes the configuration of members `1..=n` under `dir/m<id>` (region `region`,
    /// `zones`), every member listing all of them as the initial voters; starts nothing.
    pub fn new(
        bin: &Path,
        dir: &Path,
        n: usize,
        region: &str,
        zones: &[&str],
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(n > 0, "a cluster needs a member");
        let mut voters = Vec::with_capacity(n);
        let mut xds = Vec::with_capacity(n);
        for id in (1u64..).take(n) {
            let (http, raft) = (loopback(free_port()?), loopback(free_port()?));
            voters.push(Voter { id, http, raft });
            xds.push(loopback(free_port()?));
        }
        let members = voters
            .iter()
            .zip(xds)
            .map(|(me, xds)| {
                AuthorityProc::member(
                    bin,
                    &dir.join(format!("m{}", me.id)),
                    *me,
                    region,
                    zones,
                    xds,
                    &voters,
                )
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { members })
    }

    /// Writes `limits` as every member's `[authority.limits]` (read at the next start).
    pub fn set_limits(&mut self, limits: &LimitsSection) -> anyhow::Result<()> {
        self.members
            .iter_mut()
            .try_for_each(|m| m.set_limits(limits.clone()))
    }

    /// Gives every member a certificate from `pki` (`authority/<id>`: peers admit Raft RPC
    /// only as the id a certificate names) and serves its API, Raft and xDS over mutual
    /// TLS; this harness's API clients then speak TLS to it. Read at the next start.
    pub fn with_tls(&mut self, pki: &RegionPki) -> anyhow::Result<()> {
        for m in &mut self.members {
            m.set_tls(pki.issue(&format!("authority/{}", m.id()))?)?;
            super::api_over_tls(m.http_addr(), &pki.bundle())?;
        }
        Ok(())
    }

    /// The members' ids, in order.
    pub fn ids(&self) -> Vec<u64> {
        self.members.iter().map(AuthorityProc::id).collect()
    }

    /// Member `id`.
    pub fn member(&self, id: u64) -> anyhow::Result<&AuthorityProc> {
        self.members
            .iter()
            .find(|m| m.id() == id)
            .with_context(|| format!("no member {id}"))
    }

    /// Member `id`, to start, kill or reconfigure.
    pub fn member_mut(&mut self, id: u64) -> anyhow::Result<&mut AuthorityProc> {
        self.members
            .iter_mut()
            .find(|m| m.id() == id)
            .with_context(|| format!("no member {id}"))
    }

    /// Every member's HTTP API address, by id order.
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(AuthorityProc::http_addr).collect()
    }

    /// Every member's xDS address, by id order.
    pub fn xds_addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(AuthorityProc::xds_addr).collect()
    }

    /// Starts every member (no wait).
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        self.members.iter_mut().try_for_each(AuthorityProc::start)
    }

    /// Waits until every member answers `/readyz`, each within `deadline`.
    pub async fn wait_all_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        for m in &mut self.members {
            let id = m.id();
            if let Err(e) = m.wait_ready(deadline).await {
                let tail = m.log_tail(30);
                return Err(e.context(format!("member {id}; its log:\n{tail}")));
            }
        }
        Ok(())
    }

    /// SIGKILL member `id`.
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        self.member_mut(id)?.kill();
        Ok(())
    }

    /// Starts member `id` again on its data directory and waits for `/readyz`.
    pub async fn restart(&mut self, id: u64, deadline: Duration) -> anyhow::Result<()> {
        let m = self.member_mut(id)?;
        m.start()?;
        if let Err(e) = m.wait_ready(deadline).await {
            let tail = m.log_tail(30);
            return Err(e.context(format!("member {id}; its log:\n{tail}")));
        }
        Ok(())
    }

    /// Whether member `id`'s process runs.
    pub fn is_running(&mut self, id: u64) -> bool {
        self.member_mut(id).is_ok_and(AuthorityProc::is_running)
    }

    /// What each running member answers on `/v1/status` now (members that do not answer
    /// are left out).
    pub async fn statuses(&mut self) -> Vec<MemberStatus> {
        let mut out = Vec::new();
        for m in &mut self.members {
            if !m.is_running() {
                continue;
            }
            if let Some(s) = status(m.id(), m.http_addr()).await {
                out.push(s);
            }
        }
        out
    }

    /// The member that says it leads, if one does now (the highest term wins if two say
    /// so, as the older one is about to learn).
    pub async fn leader(&mut self) -> Option<u64> {
        leader_of(&self.statuses().await)
    }

    /// The leader's own status (its term included), if a member leads now.
    pub async fn leader_status(&mut self) -> Option<MemberStatus> {
        let statuses = self.statuses().await;
        let id = leader_of(&statuses)?;
        statuses.into_iter().find(|s| s.id == id)
    }

    /// Waits until some member other than `except` says it leads; returns its id.
    pub async fn wait_leader(
        &mut self,
        except: Option<u64>,
        deadline: Duration,
    ) -> anyhow::Result<u64> {
        wait_until("a leader", deadline, async || {
            self.leader().await.filter(|id| Some(*id) != except)
        })
        .await
    }
}

/// `GET /v1/status` of one member.
async fn status(id: u64, api: SocketAddr) -> Option<MemberStatus> {
    let r = super::get_api(api, "/v1/status", STATUS_TIMEOUT)
        .await
        .ok()?;
    if r.status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    Some(MemberStatus {
        id,
        leader: v["leader"]["id"].as_u64(),
        is_leader: v["is_leader"].as_bool() == Some(true),
        term: v["term"].as_u64(),
    })
}

/// The member that says it leads; of two (an old leader that has not heard yet), the one
/// with the higher term.
pub fn leader_of(statuses: &[MemberStatus]) -> Option<u64> {
    statuses
        .iter()
        .filter(|s| s.is_leader)
        .max_by_key(|s| s.term.unwrap_or(0))
        .map(|s| s.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: u64, is_leader: bool, term: u64) -> MemberStatus {
        MemberStatus {
            id,
            leader: is_leader.then_some(id),
            is_leader,
            term: Some(term),
        }
    }

    #[test]
    fn the_leader_is_a_member_that_says_so_with_the_highest_term() {
        assert_eq!(leader_of(&[s(1, false, 3), s(2, false, 3)]), None);
        assert_eq!(leader_of(&[s(1, false, 3), s(2, true, 3)]), Some(2));
        assert_eq!(leader_of(&[s(1, true, 2), s(3, true, 4)]), Some(3));
        assert_eq!(leader_of(&[]), None);
    }
}
