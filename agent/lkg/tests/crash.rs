//! kill -9 during writes leaves the previous or the new view, never a torn or older one.
//!
//! The test re-runs its own binary as a writer child (selected by an environment
//! variable) that puts ever-newer versions of one record and prints each version only
//! after `put` returned. The parent SIGKILLs it at a varying moment, reopens the store and
//! checks: nothing corrupt, and the record holds at least the last acknowledged version,
//! with the payload that version must have.

// Test helpers unwrap: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use waymark_lkg::{Record, SledViewStore, ViewStore};

const CHILD_ENV: &str = "WAYMARK_LKG_WRITER_DIR";
const TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

fn payload(version: u64) -> Vec<u8> {
    // Large enough to span pages, and derived from the version so a mix is detectable.
    (0..8_192u64)
        .map(|i| (version.wrapping_mul(31).wrapping_add(i) % 251) as u8)
        .collect()
}

#[test]
fn writer_child() {
    // Only does anything when launched by the parent below.
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = SledViewStore::open(std::path::Path::new(&dir)).unwrap();
    let start = store
        .load()
        .unwrap()
        .records
        .iter()
        .find(|r| r.name == "pay")
        .map_or(0, |r| r.version.parse::<u64>().unwrap());
    for version in start + 1.. {
        let record = Record {
            type_url: TYPE.into(),
            name: "pay".into(),
            version: version.to_string(),
            payload: payload(version),
        };
        store.put(&record).unwrap();
        println!("acked {version}");
    }
}

#[test]
fn kill_minus_nine_during_writes_never_loses_an_acknowledged_view() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let rounds: u64 = std::env::var("WAYMARK_LKG_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // Let it acknowledge a varying number of writes, then kill it mid-stream.
        let wanted = 1 + (round * 7) % 13;
        let mut last_acked = None;
        let mut seen = 0;
        while seen < wanted {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(v) = line.strip_prefix("acked ") {
                last_acked = Some(v.parse::<u64>().unwrap());
                seen += 1;
            }
        }
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        let last_acked = last_acked.expect("the writer acknowledged something");
        let store = SledViewStore::open(dir.path()).unwrap();
        let loaded = store.load().unwrap();
        assert!(
            loaded.corrupt.is_empty(),
            "round {round}: corrupt records {:?}",
            loaded.corrupt
        );
        let pay = loaded
            .records
            .iter()
            .find(|r| r.name == "pay")
            .expect("the record survived");
        let version: u64 = pay.version.parse().unwrap();
        assert!(
            version >= last_acked,
            "round {round}: holds {version}, acknowledged {last_acked}"
        );
        assert_eq!(
            pay.payload,
            payload(version),
            "round {round}: payload of another version"
        );
    }
}
