//! Network partitions between real processes: a network namespace joined to the root
//! namespace by a veth pair, and nftables rules that drop what crosses it.
//!
//! ```text
//!   root namespace                         namespace <tag>
//!   host_ip (10.a.b.1) ── veth <tag>h ═══ <tag>n ── ns_ip (10.a.b.2), more via add_address
//!   input: iifname <tag>h [ip saddr S] drop input: iifname <tag>n [ip daddr S] drop
//!          (ns → root, while partitioned)         (root → ns, while partitioned)
//! ```
//!
//! Each namespace has a /28: several addresses inside stand for several hosts, and a
//! partition may cut the whole namespace or only some of its addresses (traffic between
//! addresses inside the namespace never crosses the veth, so it is never cut). Mind the
//! kernel's source-address choice: a connection from inside leaves from the first address
//! unless the program binds another, so an address cut only isolates programs that bind.
//! Processes in two namespaces reach each other only through the root namespace, which
//! does not forward (the host's forwarding settings are left alone).
//!
//! Drops are on the receiver's *input* hook: an output-hook drop makes `sendto` fail with
//! EPERM, which a process sees as an error instead of a lost packet. The root-namespace
//! rule is scoped to the veth's `iifname`, so no other traffic of the host is touched.
//! Processes in the root namespace reach the namespace at [`Netns::ns_ip`]; processes
//! inside it reach the root namespace at [`Netns::host_ip`] (so whatever both sides must
//! reach binds there, not on 127.0.0.1, which is private to each namespace).
//!
//! Names are unique per run (`wm<pid><index>`), so parallel runs do not collide; whatever
//! an earlier process with the same pid left, and whatever runs that no longer exist left
//! (killed before their `Drop`), is removed before creating. [`Drop`] removes
//! the namespace, the veth pair and the rules, also when the drill fails. Needs root (or
//! CAP_NET_ADMIN), `ip` (iproute2) and `nft` (nftables): without them creation fails with
//! a message saying so — a drill that needs a partition never skips.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;

/// Namespaces created by this process so far (part of each name).
static CREATED: AtomicU32 = AtomicU32::new(0);

/// How many namespaces one process may create: the index is one hex digit of the name and
/// three bits of the subnet.
pub const NAMESPACES_MAX: u32 = 8;

/// One network namespace with a veth pair to the root namespace. See the module docs.
#[derive(Debug)]
pub struct Netns {
    tag: String,
    host_ip: Ipv4Addr,
    ns_ip: Ipv4Addr,
    /// Every address inside, `ns_ip` first.
    addrs: Vec<Ipv4Addr>,
    cut: Option<Cut>,
}

/// What a partition cuts off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// Everything crossing the veth.
    All,
    /// Only traffic to and from these addresses inside the namespace.
    Addrs(Vec<Ipv4Addr>),
}

impl Netns {
    /// Creates the namespace, the veth pair and their addresses (loopback up inside).
    pub fn create() -> anyhow::Result<Self> {
        let index = CREATED.fetch_add(1, Ordering::SeqCst);
        anyhow::ensure!(
            index < NAMESPACES_MAX,
            "at most {NAMESPACES_MAX} namespaces per process (each has its own /28)"
        );
        let pid = std::process::id();
        let tag = tag(pid, index);
        sweep_dead_runs();
        let (host_ip, ns_ip) = subnet(pid, index);
        let ns = Self {
            tag,
            host_ip,
            ns_ip,
            addrs: vec![ns_ip],
            cut: None,
        };
        ns.remove_leftovers();
        let taken = Command::new("ip").args(["-4", "-o", "addr"]).output();
        if let Ok(out) = taken {
            let text = String::from_utf8_lossy(&out.stdout);
            anyhow::ensure!(
                !text.contains(&format!("inet {host_ip}/")),
                "{host_ip} is already an address of this host: another run's namespace?"
            );
        }
        ns.build().with_context(|| {
            format!(
                "creating network namespace {} (partition drills need root or CAP_NET_ADMIN, \
                 iproute2's `ip` and nftables' `nft`: apt-get install iproute2 nftables)",
                ns.tag
            )
        })?;
        Ok(ns)
    }

    /// The namespace's name (what `ip netns exec` takes).
    pub fn name(&self) -> &str {
        &self.tag
    }

    /// The root namespace's end of the veth: how processes inside reach the root side.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// The namespace's own address: how processes in the root namespace reach it.
    pub fn ns_ip(&self) -> Ipv4Addr {
        self.ns_ip
    }

    /// Adds one more address inside the namespace (another "host" there) and returns it.
    pub fn add_address(&mut self) -> anyhow::Result<Ipv4Addr> {
        let last = *self
            .addrs
            .last()
            .expect("the namespace has its first address");
        let next = Ipv4Addr::from(u32::from(last) + 1);
        anyhow::ensure!(
            u32::from(next) & 0xf < 0xf,
            "no address left in the namespace's /28"
        );
        ip(&[
            "-n",
            &self.tag,
            "addr",
            "add",
            &format!("{next}/28"),
            "dev",
            &self.ns_if(),
        ])?;
        self.addrs.push(next);
        Ok(next)
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn exec_prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.tag]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    /// What is cut off now, if anything.
    pub fn cut(&self) -> Option<&Cut> {
        self.cut.as_ref()
    }

    /// Drops every packet crossing the veth, both ways, on each receiver's input hook.
    /// Established connections are black-holed (no RST), as in a real partition.
    pub fn partition(&mut self) -> anyhow::Result<()> {
        self.apply(Cut::All)
    }

    /// Drops only packets to and from `addrs` (addresses inside the namespace), both ways;
    /// replaces whatever partition was in force.
    pub fn partition_addrs(&mut self, addrs: &[Ipv4Addr]) -> anyhow::Result<()> {
        anyhow::ensure!(
            addrs.iter().all(|a| self.addrs.contains(a)),
            "{addrs:?} are not all addresses of namespace {}",
            self.tag
        );
        self.apply(Cut::Addrs(addrs.to_vec()))
    }

    /// Removes the partition's rules on both sides.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        if self.cut.take().is_none() {
            return Ok(());
        }
        let script = format!("delete table inet {}\n", self.tag);
        nft(None, &script).context("root namespace rule")?;
        nft(Some(&self.tag), &script).context("namespace rule")?;
        Ok(())
    }

    fn apply(&mut self, cut: Cut) -> anyhow::Result<()> {
        let (host_if, ns_if) = (self.host_if(), self.ns_if());
        let root = ruleset(&self.tag, &host_if, Side::Root, &cut);
        let inside = ruleset(&self.tag, &ns_if, Side::Namespace, &cut);
        nft(None, &root).context("root namespace rule")?;
        self.cut = Some(cut);
        nft(Some(&self.tag), &inside).context("namespace rule")?;
        Ok(())
    }

    fn host_if(&self) -> String {
        format!("{}h", self.tag)
    }

    fn ns_if(&self) -> String {
        format!("{}n", self.tag)
    }

    fn build(&self) -> anyhow::Result<()> {
        let (tag, host_if, ns_if) = (&self.tag, self.host_if(), self.ns_if());
        let host = format!("{}/28", self.host_ip);
        let inside = format!("{}/28", self.ns_ip);
        ip(&["netns", "add", tag])?;
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", tag,
        ])?;
        ip(&["addr", "add", &host, "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["-n", tag, "addr", "add", &inside, "dev", &ns_if])?;
        ip(&["-n", tag, "link", "set", &ns_if, "up"])?;
        ip(&["-n", tag, "link", "set", "lo", "up"])?;
        // Every address of the root namespace (another namespace's root side included) is
        // reachable from inside, not only this veth's.
        ip(&[
            "-n",
            tag,
            "route",
            "add",
            "default",
            "via",
            &self.host_ip.to_string(),
        ])?;
        // nft must work here too: fail now, not at the partition.
        nft(
            None,
            &format!("add table inet {tag}\ndelete table inet {tag}\n"),
        )?;
        Ok(())
    }

    /// Removes what an earlier process with the same pid left under these names.
    fn remove_leftovers(&self) {
        let _ = quiet("nft", &["delete", "table", "inet", &self.tag]);
        let _ = quiet("ip", &["netns", "del", &self.tag]);
        let _ = quiet("ip", &["link", "del", &self.host_if()]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys its end of the veth and with it the pair; the
        // link delete is for a namespace that was never created.
        let _ = quiet("nft", &["delete", "table", "inet", &self.tag]);
        let _ = quiet("ip", &["netns", "del", &self.tag]);
        let _ = quiet("ip", &["link", "del", &self.host_if()]);
    }
}

/// The name of namespace `index` (< [`NAMESPACES_MAX`]) of process `pid`: `wm`, the pid in
/// hex, the index (one hex digit). At most 11 characters, so `<tag>h` fits a veth name.
pub fn tag(pid: u32, index: u32) -> String {
    debug_assert!(index < NAMESPACES_MAX);
    format!("wm{pid:x}{index:x}")
}

/// The pid a [`tag`] was made for, if `name` is one.
pub fn tag_pid(name: &str) -> Option<u32> {
    let hex = name.strip_prefix("wm")?;
    let (pid, index) = hex.split_at(hex.len().checked_sub(1)?);
    let index = u32::from_str_radix(index, 16).ok()?;
    (index < NAMESPACES_MAX && !pid.is_empty())
        .then(|| u32::from_str_radix(pid, 16).ok())
        .flatten()
}

/// Removes namespaces, veths and root-namespace tables named by [`tag`] for processes that
/// no longer run (a drill killed before its `Drop` ran), so they neither pile up nor collide.
/// A name whose pid runs again is left alone: it may be a live run.
fn sweep_dead_runs() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    let tables = Command::new("nft")
        .args(["list", "tables", "inet"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let names = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .chain(tables.lines().filter_map(|l| l.split_whitespace().nth(2)));
    let dead: std::collections::BTreeSet<String> = names
        .filter(|n| tag_pid(n).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()))
        .map(str::to_owned)
        .collect();
    for name in dead {
        let _ = quiet("nft", &["delete", "table", "inet", &name]);
        let _ = quiet("ip", &["netns", "del", &name]);
        let _ = quiet("ip", &["link", "del", &format!("{name}h")]);
    }
}

/// The /28 of namespace `index` of process `pid`, in 10.64.0.0/10 (away from the usual
/// 10.0/16 and 10.1/16 of container and VPN setups): (root side, first namespace side).
pub fn subnet(pid: u32, index: u32) -> (Ipv4Addr, Ipv4Addr) {
    // 18 bits of subnet number (22 host bits of 10.64.0.0/10 in /28s): 15 from the pid,
    // 3 from the index.
    let n = ((pid & 0x7fff) << 3) | (index & 0x7);
    let base = (10u32 << 24) | (1 << 22) | (n << 4);
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

/// Which side of the veth a ruleset is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The root namespace: drops what arrives from the namespace.
    Root,
    /// The namespace: drops what arrives from the root namespace.
    Namespace,
}

/// The nftables script that replaces table `tag` with one dropping, on the input hook,
/// what arrives on `iface` and matches `cut` (for [`Cut::Addrs`]: from those addresses on
/// the root side, to them on the namespace side).
pub fn ruleset(tag: &str, iface: &str, side: Side, cut: &Cut) -> String {
    let matcher = match cut {
        Cut::All => String::new(),
        Cut::Addrs(addrs) => {
            let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            let dir = match side {
                Side::Root => "saddr",
                Side::Namespace => "daddr",
            };
            format!(" ip {dir} {{ {} }}", list.join(", "))
        }
    };
    // `add` then `delete` makes the delete safe when the table does not exist yet; the
    // whole script is one transaction.
    format!(
        "add table inet {tag}\ndelete table inet {tag}\ntable inet {tag} {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n    iifname \"{iface}\"{matcher} drop\n  }}\n}}\n"
    )
}

/// `ip ARGS…`, failing with its stderr.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    run(Command::new("ip").args(args), "ip")
}

/// `nft -f -` with `script` on stdin, in the root namespace or in `netns`.
fn nft(netns: Option<&str>, script: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft", "-f", "-"]);
            c
        }
        None => {
            let mut c = Command::new("nft");
            c.args(["-f", "-"]);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running `nft` (nftables installed? apt-get install nftables)")?;
    child
        .stdin
        .take()
        .context("nft's stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft ({}) failed ({}): {}\nscript:\n{script}",
        netns.unwrap_or("root namespace"),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("running `{what}` (is it installed?)"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn quiet(program: &str, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new(program).args(args).output()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_process_and_nothing_else_parses_as_one() {
        assert_eq!(tag(0x3f2a1, 5), "wm3f2a15");
        assert_eq!(tag_pid("wm3f2a15"), Some(0x3f2a1));
        assert_eq!(tag_pid(&tag(u32::MAX, 7)), Some(u32::MAX));
        assert!(
            format!("{}h", tag(u32::MAX, 7)).len() <= 15,
            "the veth name fits"
        );
        assert_eq!(tag_pid("wm1"), None);
        assert_eq!(tag_pid("wm1f8"), None, "index out of range");
        assert_eq!(tag_pid("cni0"), None);
        assert_eq!(tag_pid("wmzz1"), None);
    }

    #[test]
    fn subnets_differ_per_namespace_and_per_process() {
        let (h, n) = subnet(1234, 0);
        assert_eq!(u32::from(n), u32::from(h) + 1);
        assert_eq!(u32::from(h) & 0xf, 1, "{h} is the first host of a /28");
        assert_ne!(subnet(1234, 1).0, h);
        assert_ne!(subnet(1235, 0).0, h);
        assert_eq!(h.octets()[0], 10);
        assert!((0x40..0x80).contains(&h.octets()[1]), "{h}");
        let (h, _) = subnet(u32::MAX, 7);
        assert!((0x40..0x80).contains(&h.octets()[1]), "{h}");
    }

    #[test]
    fn a_whole_namespace_cut_drops_everything_on_the_veth_at_input() {
        let r = ruleset("wm1", "wm1h", Side::Root, &Cut::All);
        assert!(r.contains("hook input"), "{r}");
        assert!(r.contains("iifname \"wm1h\" drop"), "{r}");
        assert!(r.contains("policy accept"), "{r}");
        assert!(!r.contains("hook output"), "{r}");
        assert!(
            r.starts_with("add table inet wm1\ndelete table inet wm1\n"),
            "{r}"
        );
    }

    #[test]
    fn an_address_cut_matches_the_source_at_root_and_the_destination_inside() {
        let cut = Cut::Addrs(vec![
            Ipv4Addr::new(10, 64, 0, 3),
            Ipv4Addr::new(10, 64, 0, 4),
        ]);
        let root = ruleset("wm1", "wm1h", Side::Root, &cut);
        assert!(
            root.contains("iifname \"wm1h\" ip saddr { 10.64.0.3, 10.64.0.4 } drop"),
            "{root}"
        );
        let inside = ruleset("wm1", "wm1n", Side::Namespace, &cut);
        assert!(
            inside.contains("iifname \"wm1n\" ip daddr { 10.64.0.3, 10.64.0.4 } drop"),
            "{inside}"
        );
    }
}
