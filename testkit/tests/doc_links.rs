//! The documentation's relative links lead somewhere.
//!
//! Reads `README.md`, every `docs/*.md` and every other `README.md`/`*.md` the workspace
//! keeps beside its crates (outside `target/`, `node_modules/` and dot-directories), and
//! checks each Markdown link `[text](target)` that is not a URL: the file it names exists
//! (relative to the page), and a `#fragment` names a heading of that page as GitHub makes
//! its anchors (lower case, punctuation dropped, spaces as `-`, a repeated heading `-1`,
//! `-2`, …). A guide split into pages, a renamed heading or a moved file breaks links
//! silently otherwise; this names each one with its page and line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit sits in the workspace")
        .to_path_buf()
}

/// Every Markdown page of the project, found from the root down.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().unwrap().is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    stack.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a page offers: one per heading outside code blocks, numbered on repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `(line number, target)` for each inline link outside code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Drop code spans so `[a](b)` written as an example is not a link.
        let mut plain = String::new();
        let mut in_span = false;
        for c in line.chars() {
            if c == '`' {
                in_span = !in_span;
            } else if !in_span {
                plain.push(c);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let dest = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !dest.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            }
            if let Some(fragment) = fragment {
                let offered = if dest.is_file() {
                    anchors(&std::fs::read_to_string(&dest).unwrap())
                } else {
                    BTreeSet::new()
                };
                if !offered.contains(fragment) {
                    broken.push(format!(
                        "{shown}:{line}: {target}: no heading with that anchor"
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_documentation_resolves() {
    let broken = broken_links(&workspace_root());
    assert!(
        broken.is_empty(),
        "broken links in the documentation:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_missing_page_or_heading_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(
        dir.path().join("docs/guide.md"),
        "# Guide\n\n## Running an authority\n\n## Logs\n\n## Logs\n\n```\n# not a heading\n```\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("README.md"),
        "[ok](docs/guide.md#running-an-authority) [ok](docs/guide.md#logs-1) \
         [gone](docs/missing.md) [bad](docs/guide.md#not-a-heading) `[code](nowhere.md)`\n\
         [web](https://example.org/x.md)\n",
    )
    .unwrap();
    let broken = broken_links(dir.path());
    assert_eq!(
        broken,
        vec![
            "README.md:1: docs/missing.md: no such file".to_string(),
            "README.md:1: docs/guide.md#not-a-heading: no heading with that anchor".to_string(),
        ]
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(slug("The xDS edge"), "the-xds-edge");
    assert_eq!(
        slug("Blocking queries, filters, pages and Prometheus discovery"),
        "blocking-queries-filters-pages-and-prometheus-discovery"
    );
    assert_eq!(slug("`waymark dev`"), "waymark-dev");
    assert_eq!(
        slug("Views, the fraction guard, evacuation"),
        "views-the-fraction-guard-evacuation"
    );
}
