//! The fence around this crate's pure parts. The crate holds the tonic server and client
//! too, so `cargo tree` cannot tell the parts apart (as it does for the pure crates); this
//! reads their sources instead: the protocol state machines, translation, snapshots,
//! reconnection admission and sync bookkeeping may not name a runtime, a socket, a file or
//! a clock. Drivers (`server.rs`, `client.rs`, `lrs/`) may.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// Module files and folders that must stay pure.
const PURE: &[&str] = &[
    "protocol.rs",
    "protocol",
    "translate.rs",
    "translate",
    "snapshot.rs",
    "admission.rs",
    "sync.rs",
];

/// What a pure part may not name (outside its `#[cfg(test)]` module files).
const FORBIDDEN: &[&str] = &[
    "tokio::",
    "tonic::",
    "hyper::",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "std::fs",
    "Instant::now",
    "SystemTime::now",
    "thread_rng",
];

fn sources(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for e in entries {
            sources(&e, out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The file without its trailing `#[cfg(test)] mod tests { … }` block, which may read a
/// clock for an anchor instant.
fn non_test(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests {")
        .map_or(text, |i| &text[..i])
}

#[test]
fn the_pure_parts_name_no_runtime_socket_file_or_clock() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for p in PURE {
        sources(&src.join(p), &mut files);
    }
    assert!(
        files.len() >= PURE.len(),
        "pure modules moved? found {files:?}"
    );
    let mut found = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name.ends_with("_test.rs") || name == "props.rs" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in non_test(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!("{}:{}: {word}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a pure part reaches for I/O or a clock:\n{}",
        found.join("\n")
    );
}
