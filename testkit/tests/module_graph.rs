//! The workspace's modules import each other without cycles, and the agent's two roles not
//! at all.
//!
//! Reads each library crate of the workspace (every member with a `src/lib.rs`) from its
//! `lib.rs` down its `mod` items: every `use crate::…`/`use super::…`/`use self::…`
//! statement, grouped or over several lines, and every `crate::…`/`super::…` path written
//! inline, outside comments and strings. Test code is left out: a module declared under
//! `#[cfg(test)]` (a `tests.rs`, a `props.rs`, an inline `mod tests { … }`) is no part of
//! the library's graph, and a test that borrows a sibling module's fixtures makes no
//! dependency of the module it tests. Each path is reduced to a node — the crate's
//! top-level module, and in the agent crate also `<role>::<sub>` for the direct submodules
//! of `authority/` and `node/` — and these graphs are checked:
//!
//! - in every library crate, between its top-level modules;
//! - in the agent crate, also between `authority`'s direct submodules and between `node`'s;
//!   and no path between `authority` and `node`: what both roles use (gossip, the evidence
//!   protocol, the API client) lives where neither imports the other.
//!
//! A cycle in any of them fails with the edges around it and the lines that make them.
//! `scripts/module-graph` runs this file with `WAYMARK_MODULE_GRAPH=print` to print every
//! graph with its edges.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `from -> to -> the lines that make the edge`.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The agent crate's roles, whose direct submodules get a graph of their own.
const ROLES: [&str; 2] = ["authority", "node"];

#[test]
fn no_library_crate_has_a_module_cycle() {
    let mut failures = String::new();
    let mut printed = String::new();
    let crates = workspace_libraries();
    for (name, src) in &crates {
        let graphs = Graphs::of(src);
        let mut checked = vec![(format!("top-level modules of {name}"), &graphs.top)];
        if name == "agent" {
            checked.push((
                "submodules of agent/src/authority".into(),
                &graphs.authority,
            ));
            checked.push(("submodules of agent/src/node".into(), &graphs.node));
        }
        for (title, graph) in checked {
            let found = cycles(graph);
            let _ = writeln!(printed, "== {title}\n{}", render(graph, &found));
            for component in found {
                let _ = writeln!(
                    failures,
                    "cycle among the {title}: {}",
                    describe(&component, graph)
                );
            }
        }
    }
    if std::env::var_os("WAYMARK_MODULE_GRAPH").is_some_and(|v| v == "print") {
        println!("{printed}");
    }
    assert!(
        crates.len() >= 10,
        "expected every library crate of the workspace, found {crates:?}"
    );
    assert!(failures.is_empty(), "{failures}");
}

#[test]
fn node_and_authority_do_not_depend_on_each_other() {
    let graphs = Graphs::of(&workspace().join("agent/src"));
    for (from, to) in [("node", "authority"), ("authority", "node")] {
        if let Some(path) = path_between(&graphs.top, from, to) {
            panic!(
                "{from} depends on {to}: {}\nmove what both use out of either role",
                describe_path(&path, &graphs.top)
            );
        }
    }
}

#[test]
fn the_analysis_sees_the_crates_known_edges() {
    // Guards the tests above against passing because the parse found nothing.
    let graphs = Graphs::of(&workspace().join("agent/src"));
    for (graph, from, to) in [
        (&graphs.top, "node", "gossip"),
        (&graphs.top, "node", "evidence"),
        (&graphs.top, "authority", "evidence"),
        (&graphs.top, "dev", "authority"),
        (&graphs.authority, "member", "settings"),
        (&graphs.authority, "config", "settings"),
        (&graphs.authority, "member", "api"),
        (&graphs.node, "agent", "api"),
        (&graphs.node, "api", "shared"),
        (&graphs.node, "cache", "view"),
    ] {
        assert!(
            graph
                .get(from)
                .is_some_and(|to_set| to_set.contains_key(to)),
            "expected the edge {from} -> {to}; the parse has: {graph:#?}"
        );
    }
    let registry = Graphs::of(&workspace().join("agent/registry/src"));
    assert!(
        registry
            .top
            .get("term")
            .is_some_and(|t| t.contains_key("pipeline")),
        "expected the edge term -> pipeline in waymark-registry: {:#?}",
        registry.top
    );
}

#[test]
fn a_planted_back_edge_is_reported_as_a_cycle() {
    // A crate in miniature with the shapes the parse must follow: a grouped `use` over
    // several lines, `super::` from a nested file, an inline path, and a `use super::*`
    // in a test module that must not count; one cycle in each role.
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "lib.rs",
            "pub mod authority;\npub mod node;\npub mod gossip;\n",
        ),
        (
            "authority/mod.rs",
            "pub mod member;\npub mod config;\npub mod settings;\n\
             #[cfg(test)]\n#[path = \"authority_tests.rs\"]\nmod tests;\n",
        ),
        (
            "authority/member.rs",
            "use super::{\n    config::File,\n    settings::Settings as S,\n};\n",
        ),
        (
            "authority/config.rs",
            "// use super::member::Nothing;\nuse std::fmt;\n\
             fn f() { let _ = \"super::member::NotCode\"; }\n\
             #[cfg(test)]\nmod tests {\n    use crate::authority::member::Fixture;\n}\n\
             fn after_tests() { crate::gossip::Gossip::new(); }\n",
        ),
        (
            "authority/settings.rs",
            "pub struct Settings;\nfn back() { super::member::start(); }\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        ("node/mod.rs", "pub mod agent;\nmod api;\n"),
        (
            "node/agent.rs",
            "use crate::gossip::Gossip;\nuse crate::authority::settings::Settings;\n\
             fn serve() { super::api::router(); }\n",
        ),
        ("node/api.rs", "use super::agent::Shared;\n"),
        (
            "authority/authority_tests.rs",
            "use crate::node::agent::Fixture;\nuse super::config::Other;\n",
        ),
        ("gossip.rs", "pub struct Gossip;\n"),
    ];
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let graphs = Graphs::of(dir.path());
    let found: Vec<_> = cycles(&graphs.authority);
    assert_eq!(
        found,
        vec![vec!["member".to_string(), "settings".to_string()]],
        "{:#?}",
        graphs.authority
    );
    let shown = describe(&found[0], &graphs.authority);
    assert!(shown.contains("member -> settings -> member"), "{shown}");
    assert!(shown.contains("authority/settings.rs:2"), "{shown}");
    // Neither the comment, the string nor the test module in config.rs made an edge, and
    // the test file under `#[cfg(test)]` made none to node.
    assert!(
        !graphs.authority.contains_key("config"),
        "{:#?}",
        graphs.authority
    );
    // …while the code after config.rs's test module is read again, and the test file under
    // `#[cfg(test)]` made no edge to node.
    assert!(
        graphs.top["authority"].contains_key("gossip"),
        "{:#?}",
        graphs.top
    );
    assert!(
        !graphs.top["authority"].contains_key("node"),
        "{:#?}",
        graphs.top
    );
    assert!(graphs.top["node"].contains_key("gossip"));
    assert_eq!(
        cycles(&graphs.node),
        vec![vec!["agent".to_string(), "api".to_string()]],
        "{:#?}",
        graphs.node
    );
    assert!(path_between(&graphs.top, "node", "authority").is_some());
}

/// The workspace's root: two levels above this crate's manifest is too far for some
/// members, so it is found from this crate's own place in it.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `(member path, its src/)` for every workspace member with a `src/lib.rs`, read from the
/// root `Cargo.toml`'s `members` list.
fn workspace_libraries() -> Vec<(String, PathBuf)> {
    let root = workspace();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or("");
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .filter(|m| root.join(m).join("src/lib.rs").exists())
        .map(|m| (m.to_string(), root.join(m).join("src")))
        .collect()
}

/// The graph's edges, one per line (`a -> b  (file:line, …)`), then its cycles.
fn render(graph: &Graph, found: &[Vec<String>]) -> String {
    let mut out = String::new();
    for (from, to) in graph {
        for (to, sites) in to {
            let shown: Vec<&str> = sites.iter().map(String::as_str).take(3).collect();
            let more = sites.len().saturating_sub(3);
            let more = if more > 0 {
                format!(", …{more} more")
            } else {
                String::new()
            };
            let _ = writeln!(out, "{from} -> {to}  ({}{more})", shown.join(", "));
        }
    }
    for component in found {
        let _ = writeln!(out, "CYCLE {}", describe(component, graph));
    }
    if found.is_empty() {
        out.push_str("no cycles\n");
    }
    out
}

// === impl Graphs ===

/// The three graphs the checks look at.
#[derive(Debug, Default)]
struct Graphs {
    top: Graph,
    authority: Graph,
    node: Graph,
}

impl Graphs {
    fn of(src: &Path) -> Self {
        let krate = Crate::read(src);
        let mut graphs = Graphs::default();
        for (from, to, site) in krate.references() {
            let (Some(a), Some(b)) = (krate.node(&from), krate.node(&to)) else {
                continue;
            };
            let (top_a, top_b) = (top_of(&a), top_of(&b));
            if top_a != top_b {
                add(&mut graphs.top, top_a, top_b, &site);
            }
            for (role, graph) in [
                ("authority", &mut graphs.authority),
                ("node", &mut graphs.node),
            ] {
                let prefix = format!("{role}::");
                if let (Some(sub_a), Some(sub_b)) =
                    (a.strip_prefix(&prefix), b.strip_prefix(&prefix))
                    && sub_a != sub_b
                {
                    add(graph, sub_a, sub_b, &site);
                }
            }
        }
        graphs
    }
}

fn top_of(node: &str) -> &str {
    node.split("::").next().unwrap_or(node)
}

fn add(graph: &mut Graph, from: &str, to: &str, site: &str) {
    graph
        .entry(from.to_string())
        .or_default()
        .entry(to.to_string())
        .or_default()
        .insert(site.to_string());
}

// === impl Crate ===

/// The library's files, each with its module path, from `lib.rs` down its `mod` items.
struct Crate {
    src: PathBuf,
    files: Vec<(PathBuf, Vec<String>)>,
    top: BTreeSet<String>,
    /// Each role's direct submodules.
    subs: BTreeMap<String, BTreeSet<String>>,
}

impl Crate {
    fn read(src: &Path) -> Self {
        let mut krate = Crate {
            src: src.to_path_buf(),
            files: Vec::new(),
            top: BTreeSet::new(),
            subs: ROLES
                .iter()
                .map(|role| (role.to_string(), BTreeSet::new()))
                .collect(),
        };
        krate.walk(&src.join("lib.rs"), Vec::new());
        krate
    }

    fn walk(&mut self, path: &Path, module: Vec<String>) {
        let raw = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let code = strip_code(&raw);
        let here = path.parent().unwrap().to_path_buf();
        let file = path.file_name().unwrap().to_string_lossy();
        let own_dir = if file == "lib.rs" || file == "mod.rs" {
            here.clone()
        } else {
            here.join(file.trim_end_matches(".rs"))
        };
        let mut pending_path: Option<String> = None;
        let mut pending_test = false;
        for (raw_line, line) in raw.lines().zip(code.lines()) {
            if let Some(p) = path_attribute(raw_line) {
                pending_path = Some(p);
                continue;
            }
            if test_attribute(line) {
                pending_test = true;
                continue;
            }
            if let Some(name) = mod_declaration(line) {
                if std::mem::take(&mut pending_test) {
                    pending_path = None;
                    continue;
                }
                let child = match pending_path.take() {
                    Some(p) => here.join(p),
                    None => {
                        let flat = own_dir.join(format!("{name}.rs"));
                        if flat.exists() {
                            flat
                        } else {
                            own_dir.join(&name).join("mod.rs")
                        }
                    }
                };
                if module.is_empty() {
                    self.top.insert(name.clone());
                }
                if let [role] = module.as_slice()
                    && let Some(subs) = self.subs.get_mut(role)
                {
                    subs.insert(name.clone());
                }
                let mut sub = module.clone();
                sub.push(name);
                if child.exists() {
                    self.walk(&child, sub);
                }
            } else if !line.trim_start().starts_with("#[") && !line.trim().is_empty() {
                pending_path = None;
                pending_test = false;
            }
        }
        self.files.push((path.to_path_buf(), module));
    }

    /// The graph node a module path belongs to, if it is one of this crate's modules.
    fn node(&self, path: &[String]) -> Option<String> {
        let first = path.first()?;
        if let Some(subs) = self.subs.get(first)
            && let Some(sub) = path.get(1)
            && subs.contains(sub)
        {
            return Some(format!("{first}::{sub}"));
        }
        self.top.contains(first).then(|| first.clone())
    }

    /// `(from module, to module path, "file:line")` for every crate-internal path named.
    fn references(&self) -> Vec<(Vec<String>, Vec<String>, String)> {
        let mut out = Vec::new();
        for (path, module) in &self.files {
            let code = strip_code(&std::fs::read_to_string(path).unwrap());
            let lines: Vec<&str> = code.lines().collect();
            let shown = path
                .strip_prefix(self.src.parent().unwrap_or(&self.src))
                .unwrap_or(path)
                .display()
                .to_string();
            // Inline `mod name { … }` blocks, with the brace depth each closes at.
            let mut inline: Vec<(String, i64)> = Vec::new();
            let mut depth = 0i64;
            let mut pending_test = false;
            let mut k = 0;
            while k < lines.len() {
                if test_attribute(lines[k]) {
                    pending_test = true;
                    k += 1;
                    continue;
                }
                if pending_test
                    && !lines[k].trim().is_empty()
                    && !lines[k].trim_start().starts_with("#[")
                {
                    // The item under `#[cfg(test)]` (a `use`, an inline module, a function):
                    // its braces balance, so skipping it leaves the depth as it was.
                    pending_test = false;
                    k = item_end(&lines, k) + 1;
                    continue;
                }
                let mut current = module.clone();
                current.extend(inline.iter().map(|(name, _)| name.clone()));
                if let Some(name) = inline_mod(lines[k]) {
                    inline.push((name, depth));
                }
                let (refs, end) = match use_body(lines[k]) {
                    Some(first) => {
                        let mut statement = first.to_string();
                        let mut end = k;
                        while !statement.contains(';') && end + 1 < lines.len() {
                            end += 1;
                            statement.push(' ');
                            statement.push_str(lines[end]);
                        }
                        let body = statement.split(';').next().unwrap_or("");
                        (expand_use(body), end)
                    }
                    None => (inline_paths(lines[k]), k),
                };
                for r in refs {
                    let segments: Vec<String> = r.split("::").map(str::to_string).collect();
                    if let Some(target) = resolve(&current, &segments) {
                        out.push((current.clone(), target, format!("{shown}:{}", k + 1)));
                    }
                }
                for line in &lines[k..=end] {
                    for ch in line.chars() {
                        match ch {
                            '{' => depth += 1,
                            '}' => {
                                depth -= 1;
                                while inline.last().is_some_and(|(_, d)| depth <= *d) {
                                    inline.pop();
                                }
                            }
                            _ => {}
                        }
                    }
                }
                k = end + 1;
            }
        }
        out
    }
}

/// `crate::a::b` → `a::b`; `super::x` from `m::n` → `m::x`. `None` for a glob of a parent
/// (only test modules write `use super::*`) or a path above the crate.
fn resolve(current: &[String], segments: &[String]) -> Option<Vec<String>> {
    if segments.first().map(String::as_str) == Some("crate") {
        return Some(segments[1..].to_vec());
    }
    let mut base = current.to_vec();
    let mut i = usize::from(segments.first().map(String::as_str) == Some("self"));
    while segments.get(i).map(String::as_str) == Some("super") {
        base.pop()?;
        i += 1;
    }
    match segments.get(i).map(String::as_str) {
        None | Some("*") => None,
        Some(_) => {
            base.extend_from_slice(&segments[i..]);
            Some(base)
        }
    }
}

// === the line parser ===

/// `#[cfg(test)]`, or a `cfg` that needs `test` (`#[cfg(all(test, unix))]`); not
/// `#[cfg(not(test))]`.
fn test_attribute(line: &str) -> bool {
    let Some(predicate) = line.trim_start().strip_prefix("#[cfg(") else {
        return false;
    };
    let words: Vec<&str> = predicate
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect();
    words.contains(&"test") && !words.contains(&"not") && !words.contains(&"any")
}

/// The last line of the item that starts at `start`: where its first `;` is if that comes
/// before any `{`, else where the braces it opens balance again.
fn item_end(lines: &[&str], start: usize) -> usize {
    let mut depth = 0i64;
    let mut opened = false;
    for (k, line) in lines.iter().enumerate().skip(start) {
        for ch in line.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened => return k,
                _ => {}
            }
            if opened && depth == 0 {
                return k;
            }
        }
    }
    lines.len().saturating_sub(1)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn path_attribute(raw: &str) -> Option<String> {
    let rest = raw.trim_start().strip_prefix("#[path")?;
    let rest = rest
        .trim_start()
        .strip_prefix('=')?
        .trim_start()
        .strip_prefix('"')?;
    Some(rest.split('"').next()?.to_string())
}

/// `mod name;` (a file module), with any visibility.
fn mod_declaration(line: &str) -> Option<String> {
    let rest = after_visibility(line)?.strip_prefix("mod ")?.trim();
    let name = rest.strip_suffix(';')?.trim();
    name.chars().all(is_ident).then(|| name.to_string())
}

/// `mod name {` (an inline module).
fn inline_mod(line: &str) -> Option<String> {
    let rest = after_visibility(line)?.strip_prefix("mod ")?;
    let name: String = rest
        .trim_start()
        .chars()
        .take_while(|c| is_ident(*c))
        .collect();
    let after = rest.trim_start()[name.len()..].trim_start();
    (!name.is_empty() && after.starts_with('{')).then_some(name)
}

/// What follows `use ` on a line that starts a use statement.
fn use_body(line: &str) -> Option<&str> {
    after_visibility(line)?.strip_prefix("use ")
}

fn after_visibility(line: &str) -> Option<&str> {
    let line = line.trim_start();
    let Some(rest) = line.strip_prefix("pub") else {
        return Some(line);
    };
    if let Some(restricted) = rest.strip_prefix('(') {
        return Some(restricted.split_once(')')?.1.trim_start());
    }
    rest.starts_with(char::is_whitespace)
        .then(|| rest.trim_start())
}

/// `a::{b, c::{d, self}}` → `a::b`, `a::c::d`, `a::c`; renames (`as x`) dropped.
fn expand_use(tree: &str) -> Vec<String> {
    let mut compact = String::new();
    let mut words = tree.split_whitespace();
    while let Some(word) = words.next() {
        if word == "as" {
            if let Some(name) = words.next() {
                compact.push_str(name.trim_start_matches(is_ident));
            }
        } else {
            compact.push_str(word);
        }
    }
    let mut out = Vec::new();
    expand_group(&compact, &[], &mut out);
    out.retain(|p| !p.is_empty());
    out
}

fn expand_group(group: &str, prefix: &[String], out: &mut Vec<String>) {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, ch) in group.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        if let Some((head, rest)) = item.split_once('{') {
            let mut inner = prefix.to_vec();
            let head = head.trim_end_matches(':');
            if !head.is_empty() {
                inner.push(head.to_string());
            }
            let body = &rest[..rest.rfind('}').unwrap_or(rest.len())];
            expand_group(body, &inner, out);
        } else if item == "self" {
            out.push(prefix.join("::"));
        } else {
            let mut path = prefix.to_vec();
            path.push(item.to_string());
            out.push(path.join("::"));
        }
    }
}

/// `crate::…`, `super::…` and `self::…` paths written in a line of code.
fn inline_paths(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || !is_ident(chars[i - 1]);
        let word: String = chars[i..].iter().take_while(|c| is_ident(**c)).collect();
        if word.is_empty() {
            i += 1;
            continue;
        }
        let len = word.chars().count();
        if boundary && matches!(word.as_str(), "crate" | "super" | "self") {
            let mut path = word;
            let mut j = i + len;
            while chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') {
                let next: String = chars[j + 2..]
                    .iter()
                    .take_while(|c| is_ident(**c))
                    .collect();
                if next.is_empty() {
                    break;
                }
                j += 2 + next.chars().count();
                path.push_str("::");
                path.push_str(&next);
            }
            if path.contains("::") {
                out.push(path);
            }
            i = j;
        } else {
            i += len;
        }
    }
    out
}

/// The text with comments, strings and character literals blanked, line breaks kept.
fn strip_code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let newlines = |from: usize, to: usize| {
        c[from..to.min(c.len())]
            .iter()
            .filter(|x| **x == '\n')
            .count()
    };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let (mut depth, start) = (1, i);
            i += 2;
            while i < c.len() && depth > 0 {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                } else {
                    i += 1;
                }
            }
            out.extend(std::iter::repeat_n('\n', newlines(start, i)));
        } else if c[i] == 'r'
            && (i == 0 || !is_ident(c[i - 1]))
            && matches!(next, Some('"' | '#'))
            && c[i + 1..].iter().find(|x| **x != '#') == Some(&'"')
        {
            let hashes = c[i + 1..].iter().take_while(|x| **x == '#').count();
            let start = i;
            let mut j = i + 2 + hashes;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"'
                    && c[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|x| **x == '#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            out.extend(std::iter::repeat_n('\n', newlines(start, j)));
            i = j;
        } else if c[i] == '"' {
            let start = i;
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            out.extend(std::iter::repeat_n('\n', newlines(start, j)));
            i = j + 1;
        } else if c[i] == '\'' {
            // A character literal (`'a'`, `'\n'`, `'\u{7f}'`), or else a lifetime.
            let end = if next == Some('\\') {
                c[i + 2..]
                    .iter()
                    .position(|x| *x == '\'')
                    .map(|p| i + 2 + p)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

// === graph algorithms ===

/// The strongly connected components of more than one node (Tarjan), each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let nodes: BTreeSet<&str> = graph
        .iter()
        .flat_map(|(from, to)| std::iter::once(from.as_str()).chain(to.keys().map(String::as_str)))
        .collect();
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// A shortest path `from … to` (breadth first), if any.
fn path_between(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut previous: BTreeMap<String, String> = BTreeMap::new();
    let mut frontier = vec![from.to_string()];
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for v in frontier {
            for w in graph.get(&v).into_iter().flat_map(|e| e.keys()) {
                if previous.contains_key(w) || w == from {
                    continue;
                }
                previous.insert(w.clone(), v.clone());
                if w == to {
                    let mut path = vec![w.clone()];
                    while let Some(p) = previous.get(path.last().unwrap()) {
                        path.push(p.clone());
                        if p == from {
                            break;
                        }
                    }
                    path.reverse();
                    return Some(path);
                }
                next.push(w.clone());
            }
        }
        frontier = next;
    }
    None
}

/// One closed walk through a component, each edge with where it is made.
fn describe(component: &[String], graph: &Graph) -> String {
    let start = &component[0];
    let back = component
        .iter()
        .filter(|v| graph.get(*v).is_some_and(|e| e.contains_key(start)))
        .find_map(|v| {
            path_between(graph, start, v).map(|mut p| {
                p.push(start.clone());
                p
            })
        });
    match back {
        Some(path) => describe_path(&path, graph),
        None => component.join(", "),
    }
}

fn describe_path(path: &[String], graph: &Graph) -> String {
    let mut out = path.join(" -> ");
    for pair in path.windows(2) {
        let sites = &graph[&pair[0]][&pair[1]];
        let shown: Vec<&str> = sites.iter().map(String::as_str).take(3).collect();
        let _ = write!(out, "\n  {} -> {}: {}", pair[0], pair[1], shown.join(", "));
    }
    out
}
