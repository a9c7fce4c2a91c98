//! The node agent's local API tokens file (`[agent.listen] http_tokens_file`, read from
//! disk at start and whenever it changes: `node::api_auth::parse_tokens`), and the
//! `Authorization` header a request presents against what it decodes
//! (`node::api_auth::judge`).
//!
//! Input: the file, then a 0xff byte, then the header's bytes (no 0xff: the whole input is
//! the file, and the header is absent). A file that decodes admits exactly its token
//! lines, each as `Bearer <line>`; any header is judged without a panic, and admitted only
//! when it carries one of them.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use waymark_agent::node::api_auth::{Verdict, judge, parse_tokens};

fuzz_target!(|data: &[u8]| {
    let (file, header) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let Ok(text) = std::str::from_utf8(file) else {
        return;
    };
    let Ok(digests) = parse_tokens(Path::new("/fuzz/tokens"), text) else {
        return;
    };
    let tokens: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(digests.len(), tokens.len(), "one digest per token line");
    for t in &tokens {
        let bearer = format!("Bearer {t}");
        assert_eq!(judge(Some(bearer.as_bytes()), &digests), Verdict::Admitted);
    }
    let verdict = judge(header, &digests);
    if verdict == Verdict::Admitted {
        let presented = header
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .expect("an admitted header is a bearer token");
        assert!(tokens.contains(&presented), "admitted only a token of the file");
    }
});
