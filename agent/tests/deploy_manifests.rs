//! The Kubernetes manifests and systemd units in `deploy/`, checked the way an operator meets
//! them rather than read as illustrations:
//!
//! - every manifest validates offline against the API schemas of Kubernetes 1.32 (the oldest
//!   release they support: the pod-index label is GA there) and 1.37 (`kubernetes-validate
//!   --strict`);
//! - the kustomization lists every manifest, the steps its header documents (run as written,
//!   with this build as `waymark`) make every file its Secrets come from, and it renders
//!   (`kubectl kustomize`, where kubectl is installed) into manifests that validate too;
//! - the configuration each ConfigMap carries, read with the environment its pods get
//!   (downward API, Secrets, `$(VAR)`), is accepted by `waymark … --print-config`, and says
//!   what the workload around it assumes: member ids and addresses from the StatefulSet's pod
//!   names, zones from the DaemonSets' node selectors, paths from the volume mounts, ports
//!   from the container ports;
//! - probes, RBAC and the node-local Service are what docs/install.md promises; the members'
//!   Raft port is published to and reachable from the other members only; the example
//!   sidecar carries deploy/envoy's files unchanged;
//! - the API is TLS: the probes speak HTTPS, the CLI in a member's pod trusts the member's
//!   bundle, each member's certificate (as those steps issue it) passes a name-checking
//!   client for its pod's and the Service's names, the example Prometheus job dials exactly
//!   those names with a token, and the management token is a Secret mounted where
//!   `[authority.acl]` reads it;
//! - the systemd units pass `systemd-analyze verify` (where systemd is installed; the test
//!   says when it is not) and agree with the example configurations.
//!
//! YAML is read with the venv's PyYAML (the crate has no YAML parser of its own); without
//! the venv the tests fail with the command that makes it. The documented steps need bash
//! and openssl, as they do for an operator.
// Helpers outside #[test] fns panic on purpose: a panic is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Probe, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde::de::DeserializeOwned;
use serde_json::Value;
use waymark_certs::error::PemPart;
use waymark_certs::material::{parse_certs, root_store};

const WAYMARK: &str = env!("CARGO_BIN_EXE_waymark");
/// The Kubernetes releases every manifest is validated against.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.32.0", "1.37.0"];
const NAMESPACE: &str = "waymark";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// What a Secret generated from a file holds: the file, newline included
/// (`openssl rand -hex 32 > pki/gossip-keys`).
const GOSSIP_KEYS_FILE: &str = "0e6f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7\n";

// === where things are ===

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubernetes_dir() -> PathBuf {
    root().join("deploy/kubernetes")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every manifest: deploy/kubernetes/*.yaml (the kustomization aside) and examples/.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = yaml_files(&kubernetes_dir())
        .into_iter()
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.extend(yaml_files(&kubernetes_dir().join("examples")));
    assert!(files.len() >= 10, "manifests missing: {files:?}");
    files
}

// === the venv's tools ===

fn missing_tools_message(what_was_tried: &str) -> String {
    format!(
        "these tests need kubernetes-validate and PyYAML from the workspace's venv, and none \
         was found ({what_was_tried}). Install them with `./scripts/install-test-peers` from \
         the workspace root (it prints the venv's python), or point WAYMARK_PYTHON at a python \
         that has them: WAYMARK_PYTHON=$(./scripts/install-test-peers | tail -1) \
         cargo test -p waymark-agent --test integration deploy_manifests::"
    )
}

/// The venv's python (`WAYMARK_PYTHON`, else `.venv/bin/python`), checked once.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let path = std::env::var_os("WAYMARK_PYTHON")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join(".venv/bin/python"));
        let out = Command::new(&path)
            .args(["-c", "import kubernetes_validate, yaml"])
            .output();
        match out {
            Ok(o) if o.status.success() => path,
            Ok(o) => panic!(
                "{}",
                missing_tools_message(&format!(
                    "{} cannot import them: {}",
                    path.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            ),
            Err(e) => panic!(
                "{}",
                missing_tools_message(&format!("{} does not run: {e}", path.display()))
            ),
        }
    })
}

/// `kubernetes-validate`, installed beside the venv's python.
fn kubernetes_validate() -> PathBuf {
    let bin = python().with_file_name("kubernetes-validate");
    assert!(
        bin.is_file(),
        "{}",
        missing_tools_message(&format!("there is no {}", bin.display()))
    );
    bin
}

/// Every YAML document of each file, as JSON, read by PyYAML in one process.
fn read_yaml(files: &[PathBuf]) -> BTreeMap<PathBuf, Vec<Value>> {
    const SCRIPT: &str = "import json, sys, yaml\n\
        out = {}\n\
        for p in sys.argv[1:]:\n\
        \x20   with open(p) as f:\n\
        \x20       out[p] = [d for d in yaml.safe_load_all(f) if d is not None]\n\
        json.dump(out, sys.stdout)\n";
    let out = Command::new(python())
        .arg("-c")
        .arg(SCRIPT)
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reading YAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: BTreeMap<String, Vec<Value>> = serde_json::from_slice(&out.stdout).unwrap();
    parsed
        .into_iter()
        .map(|(p, docs)| (PathBuf::from(p), docs))
        .collect()
}

fn read_yaml_one(file: &Path) -> Vec<Value> {
    read_yaml(&[file.to_owned()]).into_values().next().unwrap()
}

// === the manifests as objects ===

/// Every document of every manifest.
struct Manifests {
    docs: Vec<(PathBuf, Value)>,
}

impl Manifests {
    fn load() -> Self {
        let docs = read_yaml(&manifest_files())
            .into_iter()
            .flat_map(|(path, docs)| docs.into_iter().map(move |d| (path.clone(), d)))
            .collect();
        Self { docs }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d["kind"] == kind)
            .collect()
    }

    /// The documents of `kind` that the kustomization applies (examples/ aside).
    fn deployed(&self, kind: &str) -> Vec<&Value> {
        let dir = kubernetes_dir();
        self.docs
            .iter()
            .filter(|(path, d)| path.parent() == Some(dir.as_path()) && d["kind"] == kind)
            .map(|(_, d)| d)
            .collect()
    }

    fn get<T: DeserializeOwned>(&self, kind: &str, name: &str) -> T {
        let doc = self
            .all(kind)
            .into_iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} named {name} in deploy/kubernetes"));
        serde_json::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("{kind} {name} does not read as one: {e}"))
    }

    /// The node agents' DaemonSets (one per zone).
    fn agent_daemonsets(&self) -> Vec<DaemonSet> {
        let found: Vec<DaemonSet> = self
            .all("DaemonSet")
            .into_iter()
            .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/name"] == "waymark-agent")
            .map(|d| serde_json::from_value(d.clone()).unwrap())
            .collect();
        assert!(!found.is_empty(), "no node agent DaemonSet");
        found
    }

    fn authority(&self) -> StatefulSet {
        self.get("StatefulSet", "waymark-authority")
    }
}

fn pod_spec_of_statefulset(s: &StatefulSet) -> PodSpec {
    s.spec.clone().unwrap().template.spec.unwrap()
}

fn pod_spec_of_daemonset(d: &DaemonSet) -> PodSpec {
    d.spec.clone().unwrap().template.spec.unwrap()
}

fn only_container(pod: &PodSpec) -> &Container {
    assert_eq!(pod.containers.len(), 1, "one container per waymark pod");
    &pod.containers[0]
}

fn port(c: &Container, name: &str) -> u16 {
    let p = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("container {} has no port named {name}", c.name));
    u16::try_from(p.container_port).unwrap()
}

/// Where `volume` is mounted in `c`.
fn mount_path(c: &Container, volume: &str) -> String {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .unwrap_or_else(|| panic!("container {} does not mount {volume}", c.name))
        .mount_path
        .clone()
}

/// The `--config` file named in the container's arguments, and the ConfigMap text behind it
/// (checking that the path is a key of the ConfigMap mounted there).
fn config_file(m: &Manifests, pod: &PodSpec, c: &Container) -> (String, String) {
    let args = c.args.clone().unwrap_or_default();
    let at = args.iter().position(|a| a == "--config").expect("--config");
    let path = args[at + 1].clone();
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|v| path.starts_with(&format!("{}/", v.mount_path)))
        .unwrap_or_else(|| panic!("{path} is not inside a mounted volume"));
    let key = &path[mount.mount_path.len() + 1..];
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let name = volume
        .config_map
        .as_ref()
        .expect("a ConfigMap volume")
        .name
        .clone();
    let cm: ConfigMap = m.get("ConfigMap", &name);
    let text = cm
        .data
        .unwrap_or_default()
        .get(key)
        .unwrap_or_else(|| panic!("ConfigMap {name} has no key {key} (the --config file)"))
        .clone();
    (path, text)
}

/// The container's environment as the kubelet would give it in a pod where the downward
/// API's fields read `facts`: literals with `$(VAR)` expanded from earlier variables,
/// fieldRefs from `facts`, Secret keys from `secrets` (name, key).
fn pod_env(
    c: &Container,
    facts: &BTreeMap<&str, String>,
    secrets: &BTreeMap<(&str, &str), &str>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for var in c.env.iter().flatten() {
        let value = if let Some(v) = &var.value {
            let mut v = v.clone();
            for (name, value) in &env {
                v = v.replace(&format!("$({name})"), value);
            }
            v
        } else {
            let from = var.value_from.as_ref().expect("value or valueFrom");
            if let Some(f) = &from.field_ref {
                facts
                    .get(f.field_path.as_str())
                    .unwrap_or_else(|| panic!("no sample value for fieldRef {}", f.field_path))
                    .clone()
            } else if let Some(s) = &from.secret_key_ref {
                (*secrets
                    .get(&(s.name.as_str(), s.key.as_str()))
                    .unwrap_or_else(|| panic!("no Secret {}/{}", s.name, s.key)))
                .to_owned()
            } else {
                panic!("{}: an env source the test does not model", var.name)
            }
        };
        env.push((var.name.clone(), value));
    }
    env
}

/// `waymark <role> --config <text> --print-config` in exactly `env`, parsed.
fn print_config(role: &str, text: &str, env: &[(String, String)]) -> toml::Table {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{role}.toml"));
    std::fs::write(&file, text).unwrap();
    let out = Command::new(WAYMARK)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args([role, "--config"])
        .arg(&file)
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`waymark {role} --print-config` refuses the ConfigMap's configuration in the pod's \
         environment:\n{}\nenvironment: {env:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

fn strings(v: &toml::Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("{v} is not a list"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn str_at<'a>(t: &'a toml::Table, path: &str) -> &'a str {
    let mut v: &toml::Value = &t[path.split('.').next().unwrap()];
    for part in path.split('.').skip(1) {
        v = &v[part];
    }
    v.as_str()
        .unwrap_or_else(|| panic!("{path} is not a string: {v}"))
}

/// The stable DNS name of StatefulSet pod `i` behind its headless Service.
fn member_host(sts: &StatefulSet, i: i32) -> String {
    let name = sts.metadata.name.clone().unwrap();
    let service = sts.spec.as_ref().unwrap().service_name.clone().unwrap();
    format!("{name}-{i}.{service}.{NAMESPACE}.svc.cluster.local")
}

/// The zone each agent DaemonSet runs in (its node selector).
fn daemonset_zone(d: &DaemonSet) -> String {
    pod_spec_of_daemonset(d)
        .node_selector
        .unwrap_or_default()
        .get(ZONE_LABEL)
        .unwrap_or_else(|| panic!("DaemonSet without a {ZONE_LABEL} node selector"))
        .clone()
}

/// The kustomization's generated Secrets: name → (key → source file).
fn secret_generator() -> BTreeMap<String, BTreeMap<String, String>> {
    let k = read_yaml_one(&kubernetes_dir().join("kustomization.yaml"))
        .pop()
        .unwrap();
    k["secretGenerator"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let files = g["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    let (key, path) = f.as_str().unwrap().split_once('=').unwrap();
                    (key.to_owned(), path.to_owned())
                })
                .collect();
            (g["name"].as_str().unwrap().to_owned(), files)
        })
        .collect()
}

/// Authority pod `i`'s address in the samples.
fn authority_pod_ip(i: i32) -> String {
    format!("10.1.0.{}", 10 + i)
}

/// The environment of authority pod `i`'s container `c`, as the kubelet would give it.
fn authority_pod_env(c: &Container, i: i32) -> Vec<(String, String)> {
    let facts = BTreeMap::from([
        ("metadata.name", format!("waymark-authority-{i}")),
        ("metadata.namespace", NAMESPACE.to_owned()),
        ("status.podIP", authority_pod_ip(i)),
        (
            "metadata.labels['apps.kubernetes.io/pod-index']",
            i.to_string(),
        ),
    ]);
    let secrets = BTreeMap::from([(("waymark-gossip", "keys"), GOSSIP_KEYS_FILE)]);
    pod_env(c, &facts, &secrets)
}

/// The configuration authority pod `i` runs with, as the member prints it.
fn authority_config(m: &Manifests, i: i32) -> toml::Table {
    let pod = pod_spec_of_statefulset(&m.authority());
    let c = only_container(&pod);
    let (_, text) = config_file(m, &pod, c);
    print_config("authority", &text, &authority_pod_env(c, i))
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> &'a str {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in the container's environment"))
}

/// A file of a Secret volume, as a container sees it.
struct SecretFile {
    secret: String,
    key: String,
    /// The file's mode (the volume's `defaultMode`, 0644 when unset).
    mode: i32,
}

/// The Secret key behind `path` in `c` (which must lie in a mounted Secret volume).
fn secret_file(pod: &PodSpec, c: &Container, path: &str) -> SecretFile {
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|v| path.starts_with(&format!("{}/", v.mount_path)))
        .unwrap_or_else(|| panic!("{path} is not inside a volume {} mounts", c.name));
    let file = &path[mount.mount_path.len() + 1..];
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let secret = volume
        .secret
        .as_ref()
        .unwrap_or_else(|| panic!("{path}: volume {} is not a Secret", volume.name));
    // With `items`, a file is the key its item names; without, each key is a file.
    let item = secret.items.iter().flatten().find(|i| i.path == file);
    SecretFile {
        secret: secret.secret_name.clone().unwrap(),
        key: item.map_or_else(|| file.to_owned(), |i| i.key.clone()),
        mode: item
            .and_then(|i| i.mode)
            .or(secret.default_mode)
            .unwrap_or(0o644),
    }
}

/// Whether `c`'s process can read a Secret volume's file of `mode`: the kubelet makes it
/// root's, with `fsGroup` as its group when the pod sets one.
fn readable_by(pod: &PodSpec, c: &Container, mode: i32) -> bool {
    let pod_context = pod.security_context.clone().unwrap_or_default();
    let user = c
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or(pod_context.run_as_user);
    mode & 0o004 != 0
        || (user == Some(0) && mode & 0o400 != 0)
        || (pod_context.fs_group.is_some() && mode & 0o040 != 0)
}

/// The source a generated Secret's key comes from, in the kustomization.
fn generated_source(secret: &str, key: &str) -> String {
    secret_generator()
        .get(secret)
        .and_then(|files| files.get(key))
        .unwrap_or_else(|| panic!("kustomization.yaml generates no Secret {secret} with key {key}"))
        .clone()
}

/// The shell steps the kustomization's header documents: its first block of lines
/// indented under `#   `.
fn documented_steps() -> String {
    let text = std::fs::read_to_string(kubernetes_dir().join("kustomization.yaml")).unwrap();
    let steps: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("#   "))
        .take_while(|l| l.starts_with("#   "))
        .map(|l| &l["#   ".len()..])
        .collect();
    assert!(
        !steps.is_empty(),
        "kustomization.yaml's header documents no steps"
    );
    steps.join("\n")
}

/// A copy of deploy/kubernetes under `root`, as in the repository, with the documented
/// steps run in `root` as an operator runs them (this build as `waymark`). Returns the
/// copy.
fn documented_copy(root: &Path) -> PathBuf {
    let copy = root.join("deploy/kubernetes");
    std::fs::create_dir_all(&copy).unwrap();
    for f in yaml_files(&kubernetes_dir()) {
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(WAYMARK, bin.join("waymark")).unwrap();
    let mut path = vec![bin];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let steps = documented_steps();
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &steps])
        .current_dir(root)
        .env("PATH", std::env::join_paths(path).unwrap())
        .output()
        .unwrap_or_else(|e| panic!("bash does not run: {e}"));
    assert!(
        out.status.success(),
        "kustomization.yaml's steps fail (they need bash and openssl):\n{steps}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    copy
}

/// A TLS client that checks the server by name against `bundle`, as curl and Prometheus do.
fn name_checking_verifier(bundle: &Path) -> Arc<WebPkiServerVerifier> {
    let pem = std::fs::read(bundle).unwrap();
    let roots = root_store(&parse_certs(&pem, PemPart::Bundle).unwrap()).unwrap();
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), waymark_certs::provider())
        .build()
        .unwrap()
}

/// `verifier`'s verdict on the chain in `fullchain` (leaf first) presented for `name`.
fn verify(
    verifier: &WebPkiServerVerifier,
    fullchain: &[CertificateDer<'static>],
    name: &str,
) -> Result<(), rustls::Error> {
    let server = ServerName::try_from(name.to_owned()).unwrap();
    verifier
        .verify_server_cert(
            &fullchain[0],
            &fullchain[1..],
            &server,
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

// === the tests ===

#[test]
fn every_manifest_validates_against_the_kubernetes_api_schemas() {
    let files = manifest_files();
    for version in KUBERNETES_VERSIONS {
        let out = Command::new(kubernetes_validate())
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .args(&files)
            .output()
            .unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A WARN is a document no schema knows (a misspelt apiVersion or kind): as bad as an
        // ERROR, though the tool exits 0 for it.
        assert!(
            out.status.success() && report.trim().is_empty(),
            "kubernetes-validate --strict for Kubernetes {version}:\n{report}"
        );
    }
}

#[test]
fn the_kustomization_lists_every_manifest_and_renders_with_material_from_waymark_certs() {
    let dir = kubernetes_dir();
    let k = read_yaml_one(&dir.join("kustomization.yaml"))
        .pop()
        .unwrap();
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let present: BTreeSet<String> = yaml_files(&dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, present,
        "kustomization.yaml resources vs the manifests on disk"
    );

    // The documented steps, in a copy of the folder: they must make every file the Secrets
    // are generated from, and nothing may be left to invent.
    let tmp = tempfile::tempdir().unwrap();
    let copy = documented_copy(tmp.path());
    for (secret, files) in secret_generator() {
        for (key, source) in files {
            assert!(
                source.starts_with("pki/") && copy.join(&source).is_file(),
                "Secret {secret} key {key}: {source} is not made by the install guide's steps"
            );
        }
    }

    let kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    if !kubectl.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "skipping `kubectl kustomize`: kubectl is not installed (the resource list and the \
             Secrets' sources were checked; kubernetes-validate checks every manifest)"
        );
        return;
    }
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = tmp.path().join("rendered.yaml");
    std::fs::write(&rendered, &out.stdout).unwrap();
    let docs = read_yaml_one(&rendered);
    let secrets: BTreeSet<String> = docs
        .iter()
        .filter(|d| d["kind"] == "Secret")
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let generated: BTreeSet<String> = secret_generator().into_keys().collect();
    assert_eq!(
        secrets, generated,
        "the rendered Secrets are the generated ones"
    );
    for version in KUBERNETES_VERSIONS {
        let v = Command::new(kubernetes_validate())
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .arg(&rendered)
            .output()
            .unwrap();
        assert!(
            v.status.success() && v.stdout.is_empty(),
            "the rendered kustomization for Kubernetes {version}:\n{}{}",
            String::from_utf8_lossy(&v.stdout),
            String::from_utf8_lossy(&v.stderr)
        );
    }
}

#[test]
fn each_authority_pod_gets_its_own_member_id_addresses_and_certificate() {
    let m = Manifests::load();
    let sts = m.authority();
    let spec = sts.spec.clone().unwrap();
    let replicas = spec.replicas.unwrap();
    assert_eq!(replicas, 3, "three members per region");
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));

    let service_name = spec.service_name.clone().unwrap();
    let svc: Service = m.get("Service", &service_name);
    let svc_spec = svc.spec.unwrap();
    assert_eq!(svc_spec.cluster_ip.as_deref(), Some("None"), "headless");
    assert_eq!(
        svc_spec.publish_not_ready_addresses,
        Some(true),
        "members must resolve each other before they are ready"
    );

    let pod = pod_spec_of_statefulset(&sts);
    let c = only_container(&pod);
    let (http, raft, xds, ingest, gossip) = (
        port(c, "http"),
        port(c, "raft"),
        port(c, "xds"),
        port(c, "ingest"),
        port(c, "gossip"),
    );
    let (_, text) = config_file(&m, &pod, c);
    let tls_mount = mount_path(c, "tls");
    let data_mount = mount_path(c, "data");
    assert!(
        spec.volume_claim_templates
            .iter()
            .flatten()
            .any(|t| t.metadata.name.as_deref() == Some("data")),
        "the Raft data lives on a PersistentVolumeClaim"
    );
    let tls_keys: BTreeSet<String> = secret_generator()["waymark-authority-tls"]
        .keys()
        .cloned()
        .collect();
    let zones: BTreeSet<String> = m.agent_daemonsets().iter().map(daemonset_zone).collect();

    for i in 0..replicas {
        let pod_ip = authority_pod_ip(i);
        let printed = print_config("authority", &text, &authority_pod_env(c, i));
        let a = printed["authority"].as_table().unwrap();
        assert_eq!(
            a["id"].as_integer(),
            Some(i64::from(i)),
            "pod {i}'s member id"
        );
        let members: Vec<(i64, String, String)> = a["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["id"].as_integer().unwrap(),
                    m["addr"].as_str().unwrap().to_owned(),
                    m["raft"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let expected: Vec<(i64, String, String)> = (0..replicas)
            .map(|j| {
                let host = member_host(&sts, j);
                (
                    i64::from(j),
                    format!("{host}:{http}"),
                    format!("{host}:{raft}"),
                )
            })
            .collect();
        assert_eq!(members, expected, "initial voters = the StatefulSet's pods");
        assert_eq!(
            str_at(&printed, "authority.http"),
            format!("0.0.0.0:{http}")
        );
        // Off loopback, which the member accepts only because Raft is mutual TLS.
        assert_eq!(
            str_at(&printed, "authority.raft"),
            format!("0.0.0.0:{raft}")
        );
        assert_eq!(str_at(&printed, "authority.xds"), format!("0.0.0.0:{xds}"));
        assert_eq!(
            str_at(&printed, "authority.ingest"),
            format!("0.0.0.0:{ingest}")
        );
        assert_eq!(str_at(&printed, "authority.data_dir"), data_mount);
        let printed_zones: BTreeSet<String> = strings(&a["zones"]).into_iter().collect();
        assert_eq!(
            printed_zones, zones,
            "the region's zones = the agents' zones"
        );

        let g = a["gossip"].as_table().unwrap();
        assert_eq!(
            g["bind"].as_str(),
            Some(format!("{pod_ip}:{gossip}").as_str())
        );
        assert_eq!(
            strings(&g["seeds"]),
            vec![format!(
                "{service_name}.{NAMESPACE}.svc.cluster.local:{gossip}"
            )]
        );
        let keys = strings(&g["keys"]);
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(keys[0].trim(), GOSSIP_KEYS_FILE.trim());

        for (field, suffix) in [("cert_chain", "fullchain.pem"), ("key", "key.pem")] {
            let path = str_at(&printed, &format!("authority.tls.{field}"));
            assert_eq!(path, format!("{tls_mount}/authority-{i}.{suffix}"));
            assert!(tls_keys.contains(&format!("authority-{i}.{suffix}")));
        }
        let bundle = str_at(&printed, "authority.tls.bundle");
        assert_eq!(bundle, format!("{tls_mount}/bundle.pem"));
    }
    let anti = pod
        .affinity
        .and_then(|a| a.pod_anti_affinity)
        .and_then(|a| a.required_during_scheduling_ignored_during_execution)
        .unwrap_or_default();
    assert!(
        anti.iter().any(|t| t.topology_key == ZONE_LABEL),
        "members spread across zones"
    );
    assert!(usize::try_from(replicas).unwrap() <= zones.len());
}

#[test]
fn raft_is_published_to_the_members_and_reachable_only_from_them() {
    // Goal: the members find each other's Raft port by name through the headless Service,
    // and the NetworkPolicy lets only authority pods reach it (and the API).
    let m = Manifests::load();
    let sts = m.authority();
    let service_name = sts.spec.clone().unwrap().service_name.unwrap();
    let svc: Service = m.get("Service", &service_name);
    let published = svc.spec.unwrap().ports.unwrap_or_default();
    let raft = published
        .iter()
        .find(|p| p.name.as_deref() == Some("raft"))
        .expect("the headless Service publishes the Raft port");
    let pod = pod_spec_of_statefulset(&sts);
    assert_eq!(
        u16::try_from(raft.port).unwrap(),
        port(only_container(&pod), "raft")
    );
    assert_eq!(raft.protocol.as_deref(), Some("TCP"));

    let policies = m.deployed("NetworkPolicy");
    assert_eq!(policies.len(), 1, "one NetworkPolicy");
    let rules = policies[0]["spec"]["ingress"].as_array().unwrap();
    let ports_of = |rule: &Value| -> BTreeSet<String> {
        rule["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["port"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let members_only = serde_json::json!([{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "waymark-authority"}}}]);
    for rule in rules {
        let ports = ports_of(rule);
        if ports.contains("raft") || ports.contains("http") {
            assert_eq!(rule["from"], members_only, "{rule}");
        }
    }
    assert!(
        rules.iter().any(|r| ports_of(r).contains("raft")),
        "the members may reach each other's Raft port"
    );
}

#[test]
fn each_node_agent_gets_its_node_zone_addresses_and_the_authority_members() {
    let m = Manifests::load();
    let sts = m.authority();
    let replicas = sts.spec.clone().unwrap().replicas.unwrap();
    let authority = pod_spec_of_statefulset(&sts);
    let ac = only_container(&authority);
    let (a_xds, a_ingest, a_gossip) = (port(ac, "xds"), port(ac, "ingest"), port(ac, "gossip"));
    let service_name = sts.spec.clone().unwrap().service_name.unwrap();
    let secrets = BTreeMap::from([(("waymark-gossip", "keys"), GOSSIP_KEYS_FILE)]);
    let node = "ip-10-0-1-17.eu-west-1.compute.internal";
    let host_ip = "10.0.1.17";

    let daemonsets = m.agent_daemonsets();
    let mut zones = BTreeSet::new();
    let mut shapes = BTreeSet::new();
    for ds in &daemonsets {
        let zone = daemonset_zone(ds);
        assert!(zones.insert(zone.clone()), "two DaemonSets for zone {zone}");
        // The copies differ only in their zone.
        shapes.insert(serde_json::to_string(ds).unwrap().replace(&zone, "<zone>"));

        let pod = pod_spec_of_daemonset(ds);
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(
            pod.dns_policy.as_deref(),
            Some("ClusterFirstWithHostNet"),
            "on the host network, only this policy resolves the members' Service names"
        );
        let c = only_container(&pod);
        let (_, text) = config_file(&m, &pod, c);
        let facts = BTreeMap::from([
            ("spec.nodeName", node.to_owned()),
            ("status.hostIP", host_ip.to_owned()),
        ]);
        let env = pod_env(c, &facts, &secrets);
        let printed = print_config("agent", &text, &env);
        assert_eq!(str_at(&printed, "agent.name"), node);
        assert_eq!(str_at(&printed, "agent.zone"), zone);
        for (listener, name) in [("xds", "xds"), ("dns", "dns-udp"), ("http", "http")] {
            assert_eq!(
                str_at(&printed, &format!("agent.listen.{listener}")),
                format!("{host_ip}:{}", port(c, name))
            );
        }
        assert_eq!(port(c, "dns-udp"), port(c, "dns-tcp"));
        let hosts = |p: u16| -> Vec<String> {
            (0..replicas)
                .map(|j| format!("{}:{p}", member_host(&sts, j)))
                .collect()
        };
        let a = printed["agent"].as_table().unwrap();
        assert_eq!(strings(&a["upstream"]), hosts(a_xds));
        assert_eq!(strings(&a["ingest"]), hosts(a_ingest));
        let g = a["gossip"].as_table().unwrap();
        assert_eq!(
            g["bind"].as_str(),
            Some(format!("{host_ip}:{}", port(c, "gossip")).as_str())
        );
        assert_eq!(
            strings(&g["seeds"]),
            vec![format!(
                "{service_name}.{NAMESPACE}.svc.cluster.local:{a_gossip}"
            )]
        );
        let keys = strings(&g["keys"]);
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(keys[0].trim(), GOSSIP_KEYS_FILE.trim());

        // The cache and the certificate are host paths: they outlive the pod.
        let host_path = |volume: &str| {
            pod.volumes
                .iter()
                .flatten()
                .find(|v| v.name == volume)
                .and_then(|v| v.host_path.clone())
                .unwrap_or_else(|| panic!("volume {volume} is not a hostPath"))
                .path
        };
        assert_eq!(str_at(&printed, "agent.data_dir"), mount_path(c, "data"));
        assert_eq!(host_path("data"), mount_path(c, "data"));
        let tls = mount_path(c, "tls");
        assert_eq!(host_path("tls"), tls, "the same layout as on a VM");
        for field in ["cert_chain", "key", "bundle"] {
            let path = str_at(&printed, &format!("agent.tls.{field}"));
            assert!(path.starts_with(&format!("{tls}/")), "{field} = {path}");
        }
    }
    assert_eq!(
        shapes.len(),
        1,
        "the agent DaemonSets differ beyond their zone"
    );
}

fn http_probe(p: &Option<Probe>, what: &str) -> (String, String, Probe) {
    let p = p.clone().unwrap_or_else(|| panic!("no {what}"));
    let get = p
        .http_get
        .clone()
        .unwrap_or_else(|| panic!("{what}: not httpGet"));
    let port = match get.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s,
        other => panic!("{what}: port {other:?} should be a named port"),
    };
    (get.path.unwrap_or_default(), port, p)
}

#[test]
fn probes_follow_the_liveness_readiness_split() {
    let m = Manifests::load();
    // The agent: liveness process-internal (/livez), readiness instance-local (/readyz),
    // with the seed's timings (restart after ~30 s wedged; out after ~15 s not ready).
    for ds in m.agent_daemonsets() {
        let pod = pod_spec_of_daemonset(&ds);
        let c = only_container(&pod);
        let (path, port_name, live) = http_probe(&c.liveness_probe, "agent liveness");
        assert_eq!((path.as_str(), port_name.as_str()), ("/livez", "http"));
        assert_eq!(
            (
                live.period_seconds,
                live.timeout_seconds,
                live.failure_threshold
            ),
            (Some(10), Some(1), Some(3))
        );
        let (path, port_name, ready) = http_probe(&c.readiness_probe, "agent readiness");
        assert_eq!((path.as_str(), port_name.as_str()), ("/readyz", "http"));
        assert_eq!(
            (
                ready.period_seconds,
                ready.timeout_seconds,
                ready.failure_threshold
            ),
            (Some(5), Some(1), Some(3))
        );
        let (path, _, _) = http_probe(&c.startup_probe, "agent startup");
        assert_eq!(
            path, "/livez",
            "start-up waits on liveness, never on the authority"
        );
        // On the node's IP the agent's API is TLS (its config check demands it there).
        for (probe, what) in [
            (&c.liveness_probe, "agent liveness"),
            (&c.readiness_probe, "agent readiness"),
            (&c.startup_probe, "agent startup"),
        ] {
            let (_, _, p) = http_probe(probe, what);
            let scheme = p.http_get.unwrap().scheme;
            assert_eq!(scheme.as_deref(), Some("HTTPS"), "{what}");
        }
    }
    // The authority: the same split, member-local (no peer, leader or quorum asked), on
    // the API's port, which a member with [authority.tls] serves over TLS only.
    let sts = m.authority();
    let pod = pod_spec_of_statefulset(&sts);
    let c = only_container(&pod);
    let printed = authority_config(&m, 0);
    let api_port = str_at(&printed, "authority.http")
        .rsplit_once(':')
        .unwrap()
        .1;
    let tls = printed["authority"].get("tls").is_some();
    for (probe, what, expected) in [
        (&c.liveness_probe, "authority liveness", "/livez"),
        (&c.readiness_probe, "authority readiness", "/readyz"),
        (&c.startup_probe, "authority startup", "/livez"),
    ] {
        let (path, port_name, p) = http_probe(probe, what);
        assert_eq!(
            (path.as_str(), port_name.as_str()),
            (expected, "http"),
            "{what}"
        );
        assert_eq!(
            port(c, &port_name).to_string(),
            api_port,
            "{what}: the API's port"
        );
        let scheme = p
            .http_get
            .unwrap()
            .scheme
            .unwrap_or_else(|| "HTTP".to_owned());
        assert_eq!(
            scheme,
            if tls { "HTTPS" } else { "HTTP" },
            "{what}: the API is TLS exactly when the member has [authority.tls]"
        );
    }
}

#[test]
fn the_management_token_is_a_secret_mounted_where_the_configuration_reads_it() {
    // Goal: the file `[authority.acl] initial_management_token_file` names is a key of a
    // generated Secret, mounted in the member's container and readable by its user, and the
    // documented steps make it a token the member accepts.
    let m = Manifests::load();
    let pod = pod_spec_of_statefulset(&m.authority());
    let c = only_container(&pod);
    let printed = authority_config(&m, 0);
    let path = str_at(&printed, "authority.acl.initial_management_token_file");
    let file = secret_file(&pod, c, path);
    assert!(
        readable_by(&pod, c, file.mode),
        "{path}: mode {:o} is not readable by the member's user",
        file.mode
    );
    for field in ["cert_chain", "key", "bundle"] {
        let tls = secret_file(&pod, c, str_at(&printed, &format!("authority.tls.{field}")));
        assert!(readable_by(&pod, c, tls.mode), "authority.tls.{field}");
    }
    let source = generated_source(&file.secret, &file.key);
    let tmp = tempfile::tempdir().unwrap();
    let copy = documented_copy(tmp.path());
    let token = std::fs::read_to_string(copy.join(&source)).unwrap();
    let (name, _) = waymark_registry::acl::parse_bearer(token.trim())
        .unwrap_or_else(|| panic!("{source} is not a wmt.<name>.<secret> token"));
    assert_eq!(
        name, "management",
        "the operator the region is bootstrapped for"
    );
}

#[test]
fn the_agents_api_tokens_are_a_secret_mounted_where_the_configuration_reads_them() {
    // Goal: off loopback an agent refuses to start without `http_tokens_file`; the file it
    // names is a key of a generated Secret, mounted and readable by the agent's user, and
    // the documented steps make a file the agent accepts.
    let m = Manifests::load();
    let tmp = tempfile::tempdir().unwrap();
    let copy = documented_copy(tmp.path());
    let secrets = BTreeMap::from([(("waymark-gossip", "keys"), GOSSIP_KEYS_FILE)]);
    let facts = BTreeMap::from([
        ("spec.nodeName", "ip-10-0-1-17".to_owned()),
        ("status.hostIP", "10.0.1.17".to_owned()),
    ]);
    for ds in m.agent_daemonsets() {
        let pod = pod_spec_of_daemonset(&ds);
        let c = only_container(&pod);
        let (_, text) = config_file(&m, &pod, c);
        let printed = print_config("agent", &text, &pod_env(c, &facts, &secrets));
        assert!(
            !str_at(&printed, "agent.listen.http").starts_with("127."),
            "the API is on the node's IP, so the tokens are required"
        );
        let path = str_at(&printed, "agent.listen.http_tokens_file");
        let file = secret_file(&pod, c, path);
        assert!(
            readable_by(&pod, c, file.mode),
            "{path}: mode {:o} is not readable by the agent's user",
            file.mode
        );
        let source = generated_source(&file.secret, &file.key);
        let text = std::fs::read_to_string(copy.join(&source)).unwrap();
        let tokens = waymark_agent::node::api_auth::parse_tokens(Path::new(path), &text)
            .unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(tokens.len(), 1, "{source}");
    }
}

#[test]
fn the_cli_in_a_member_pod_speaks_tls_to_its_own_member() {
    // Goal: `kubectl exec … waymark …` reaches the pod's own API over TLS, checking it
    // against the bundle the member itself trusts.
    let m = Manifests::load();
    let pod = pod_spec_of_statefulset(&m.authority());
    let c = only_container(&pod);
    for i in 0..m.authority().spec.unwrap().replicas.unwrap() {
        let env = authority_pod_env(c, i);
        let printed = authority_config(&m, i);
        assert!(
            printed["authority"].get("tls").is_some(),
            "the pods' API is TLS"
        );
        assert_eq!(
            env_value(&env, "WAYMARK_API"),
            format!("https://127.0.0.1:{}", port(c, "http"))
        );
        let listen = str_at(&printed, "authority.http");
        assert!(
            listen.starts_with("0.0.0.0:") || listen.starts_with("127.0.0.1:"),
            "{listen} does not answer on the pod's loopback"
        );
        assert_eq!(
            env_value(&env, "WAYMARK_CA_BUNDLE"),
            str_at(&printed, "authority.tls.bundle")
        );
    }
}

#[test]
fn each_member_certificate_answers_to_its_pod_and_service_names() {
    // Goal: curl and Prometheus, which check the name they dial, accept each member's
    // certificate as the documented steps issue it under its pod's stable name and the
    // Service's, and refuse it under another member's.
    let m = Manifests::load();
    let sts = m.authority();
    let pod = pod_spec_of_statefulset(&sts);
    let c = only_container(&pod);
    let replicas = sts.spec.clone().unwrap().replicas.unwrap();
    let service = sts.spec.clone().unwrap().service_name.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let copy = documented_copy(tmp.path());
    // The file behind a path of the container, as the documented steps made it.
    let made = |path: &str| {
        let file = secret_file(&pod, c, path);
        copy.join(generated_source(&file.secret, &file.key))
    };
    for i in 0..replicas {
        let printed = authority_config(&m, i);
        let verifier = name_checking_verifier(&made(str_at(&printed, "authority.tls.bundle")));
        let chain_pem = std::fs::read(made(str_at(&printed, "authority.tls.cert_chain"))).unwrap();
        let chain = parse_certs(&chain_pem, PemPart::Certificate).unwrap();
        for name in [
            member_host(&sts, i),
            format!("{service}.{NAMESPACE}.svc.cluster.local"),
            format!("{service}.{NAMESPACE}.svc"),
        ] {
            if let Err(e) = verify(&verifier, &chain, &name) {
                panic!("member {i}'s certificate does not answer to {name}: {e}");
            }
        }
        let other = member_host(&sts, (i + 1) % replicas);
        assert!(
            verify(&verifier, &chain, &other).is_err(),
            "member {i}'s certificate answers to {other} too"
        );
    }
}

#[test]
fn the_example_prometheus_job_scrapes_every_member_over_tls_with_a_token() {
    // Goal: the example job dials each member's API by a name its certificate carries,
    // over TLS checked against a CA file, with a bearer token from a file; and its
    // NetworkPolicy opens the API port to Prometheus and nothing else.
    let m = Manifests::load();
    let sts = m.authority();
    let pod = pod_spec_of_statefulset(&sts);
    let c = only_container(&pod);
    let replicas = sts.spec.clone().unwrap().replicas.unwrap();
    let cm: ConfigMap = m.get("ConfigMap", "waymark-scrape");
    let namespace = cm.metadata.namespace.clone().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let jobs: Vec<Value> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .flat_map(|(key, text)| {
            let file = tmp.path().join(key);
            std::fs::write(&file, text).unwrap();
            read_yaml_one(&file)
        })
        .flat_map(|d| d["scrape_configs"].as_array().cloned().unwrap_or_default())
        .collect();
    let job = jobs
        .iter()
        .find(|j| j["job_name"] == "waymark-authority")
        .expect("a waymark-authority scrape job");
    assert_eq!(job["scheme"], "https", "the API is TLS");
    assert!(job["metrics_path"].is_null() || job["metrics_path"] == "/metrics");
    let auth = &job["authorization"];
    assert!(auth["type"].is_null() || auth["type"] == "Bearer", "{auth}");
    assert!(
        auth["credentials_file"]
            .as_str()
            .is_some_and(|f| !f.is_empty())
            && auth["credentials"].is_null(),
        "the token comes from a file, never from the ConfigMap: {auth}"
    );
    let tls = &job["tls_config"];
    assert!(
        tls["ca_file"].as_str().is_some_and(|f| !f.is_empty()),
        "{tls}"
    );
    assert!(
        tls["insecure_skip_verify"] != true && tls["server_name"].is_null(),
        "the name checked is the one dialled: {tls}"
    );
    let targets: BTreeSet<String> = job["static_configs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    let members: BTreeSet<String> = (0..replicas)
        .map(|i| format!("{}:{}", member_host(&sts, i), port(c, "http")))
        .collect();
    assert_eq!(
        targets, members,
        "every member's API, by its pod's stable name"
    );

    let policy = m
        .all("NetworkPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "waymark-authority-prometheus")
        .expect("the example's NetworkPolicy");
    let pod_labels = sts.spec.unwrap().template.metadata.unwrap().labels.unwrap();
    let selector = policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    assert!(
        !selector.is_empty()
            && selector
                .iter()
                .all(|(k, v)| pod_labels.get(k).is_some_and(|l| v == l)),
        "the policy selects the authority pods"
    );
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        assert_eq!(
            rule["ports"],
            serde_json::json!([{"port": "http", "protocol": "TCP"}]),
            "the API port only"
        );
        for from in rule["from"].as_array().unwrap() {
            assert_eq!(
                from["namespaceSelector"]["matchLabels"],
                serde_json::json!({"kubernetes.io/metadata.name": namespace}),
                "from the scrape job's namespace"
            );
        }
    }
}

#[test]
fn only_the_authority_may_read_the_api_and_only_endpointslices() {
    let m = Manifests::load();
    assert!(m.all("Role").is_empty() && m.all("RoleBinding").is_empty());
    let roles = m.all("ClusterRole");
    assert_eq!(roles.len(), 1, "one ClusterRole");
    let role: ClusterRole = serde_json::from_value(roles[0].clone()).unwrap();
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].api_groups,
        Some(vec!["discovery.k8s.io".to_owned()])
    );
    assert_eq!(rules[0].resources, Some(vec!["endpointslices".to_owned()]));
    let verbs: BTreeSet<&str> = rules[0].verbs.iter().map(String::as_str).collect();
    assert_eq!(verbs, BTreeSet::from(["get", "list", "watch"]));

    let bindings = m.all("ClusterRoleBinding");
    assert_eq!(bindings.len(), 1);
    let binding: ClusterRoleBinding = serde_json::from_value(bindings[0].clone()).unwrap();
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subjects = binding.subjects.unwrap_or_default();
    let authority_sa = pod_spec_of_statefulset(&m.authority())
        .service_account_name
        .unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("ServiceAccount", authority_sa.as_str())
    );
    assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));

    for ds in m.agent_daemonsets() {
        let pod = pod_spec_of_daemonset(&ds);
        assert_eq!(pod.automount_service_account_token, Some(false));
        let sa: ServiceAccount =
            m.get("ServiceAccount", pod.service_account_name.as_ref().unwrap());
        assert_eq!(sa.automount_service_account_token, Some(false));
    }
}

#[test]
fn sidecars_reach_the_agent_on_their_own_node_through_the_local_service() {
    let m = Manifests::load();
    let svc: Service = m.get("Service", "waymark-agent");
    let spec = svc.spec.unwrap();
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
    let selector = spec.selector.unwrap();
    for ds in m.agent_daemonsets() {
        let labels = ds
            .spec
            .clone()
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
        let pod = pod_spec_of_daemonset(&ds);
        let c = only_container(&pod);
        for p in spec.ports.iter().flatten() {
            let target = match p.target_port.clone().unwrap() {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s,
                other => panic!("target port {other:?} should be named"),
            };
            let cp = c
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(target.as_str()))
                .unwrap_or_else(|| panic!("the agent has no port {target}"));
            assert_eq!(cp.protocol, p.protocol, "{target}");
        }
    }
    let xds = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("xds"))
        .unwrap()
        .port;

    let bootstrap = read_yaml_one(&root().join("deploy/envoy/sidecar-kubernetes.yaml"))
        .pop()
        .unwrap();
    let cluster = bootstrap["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "waymark_agent")
        .unwrap();
    let address = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(
        address["address"],
        format!("waymark-agent.{NAMESPACE}.svc.cluster.local")
    );
    assert_eq!(address["port_value"], xds);
}

#[test]
fn the_example_sidecar_carries_deploy_envoy_unchanged_and_mounts_what_it_names() {
    let m = Manifests::load();
    let cm: ConfigMap = m.get("ConfigMap", "billing-envoy");
    let data = cm.data.unwrap();
    let envoy = root().join("deploy/envoy");
    for (key, file) in [
        ("envoy.yaml", envoy.join("sidecar-kubernetes.yaml")),
        (
            "tls-certificate.yaml",
            envoy.join("sds/tls-certificate.yaml"),
        ),
        (
            "validation-context.yaml",
            envoy.join("sds/validation-context.yaml"),
        ),
    ] {
        assert_eq!(
            data[key],
            std::fs::read_to_string(&file).unwrap(),
            "deploy/kubernetes/examples/sidecar.yaml's {key} differs from {}",
            file.display()
        );
    }
    let deployment: Value = m
        .all("Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "billing")
        .unwrap()
        .clone();
    let pod: PodSpec =
        serde_json::from_value(deployment["spec"]["template"]["spec"].clone()).unwrap();
    let c = pod.containers.iter().find(|c| c.name == "envoy").unwrap();
    let args = c.args.clone().unwrap();
    let config = &args[args.iter().position(|a| a == "-c").unwrap() + 1];
    assert_eq!(
        config,
        &format!("{}/envoy.yaml", mount_path(c, "envoy-bootstrap"))
    );
    // Every file the bootstrap and the SDS files name is in a mounted folder.
    let named = ["/etc/envoy/waymark/sds/", "/etc/envoy/waymark/tls/"];
    for text in data.values() {
        for dir in named {
            if text.contains(dir) {
                let dir = dir.trim_end_matches('/');
                assert!(
                    c.volume_mounts
                        .iter()
                        .flatten()
                        .any(|v| v.mount_path == dir),
                    "nothing is mounted at {dir}"
                );
            }
        }
    }
}

// === systemd ===

/// `Key=value` lines of a unit file (comments and sections dropped; repeated keys kept).
fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn unit_setting<'a>(settings: &'a [(String, String)], key: &str) -> Option<&'a str> {
    settings
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_example_agent_registers_through_the_example_members_as_its_node() {
    // Goal: deploy/agent/agent.toml calls every member of deploy/authority/authority.toml
    // over TLS (its node certificate is the principal), and its service definitions name
    // the node's own address, the only one the authority admits a node's registrations at.
    let read = |file: &str| -> toml::Table {
        toml::from_str(&std::fs::read_to_string(root().join(file)).unwrap()).unwrap()
    };
    let agent = read("deploy/agent/agent.toml");
    let authority = read("deploy/authority/authority.toml");
    assert!(
        authority["authority"].get("tls").is_some(),
        "the members' API is TLS"
    );
    assert!(
        agent["agent"].get("tls").is_some(),
        "the agent has a node certificate"
    );
    let members: Vec<String> = authority["authority"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("https://{}", m["addr"].as_str().unwrap()))
        .collect();
    assert_eq!(strings(&agent["agent"]["api"]), members);

    let node_ip = str_at(&agent, "agent.gossip.bind")
        .rsplit_once(':')
        .unwrap()
        .0;
    let services = root().join("deploy/agent/services.d");
    for entry in std::fs::read_dir(&services).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let definition = read(path.to_str().unwrap());
            assert_eq!(
                str_at(&definition, "address"),
                node_ip,
                "{}: a node registers only at its own address",
                path.display()
            );
        }
    }
}

#[test]
fn systemd_units_verify_and_agree_with_the_example_configurations() {
    let dir = root().join("deploy/systemd");
    for (unit, role, example) in [
        ("waymark-agent.service", "agent", "deploy/agent/agent.toml"),
        (
            "waymark-authority.service",
            "authority",
            "deploy/authority/authority.toml",
        ),
    ] {
        let text = std::fs::read_to_string(dir.join(unit)).unwrap();
        let s = unit_settings(&text);
        let exec = unit_setting(&s, "ExecStart").unwrap();
        assert_eq!(
            exec,
            format!("/usr/local/bin/waymark {role} --config /etc/waymark/{role}.toml")
        );
        assert_eq!(unit_setting(&s, "Restart"), Some("on-failure"));
        let example: toml::Table =
            toml::from_str(&std::fs::read_to_string(root().join(example)).unwrap()).unwrap();
        let state = unit_setting(&s, "StateDirectory").unwrap();
        assert_eq!(
            str_at(&example, &format!("{role}.data_dir")),
            format!("/var/lib/{state}"),
            "{example}'s data_dir is {unit}'s StateDirectory"
        );
        for field in ["cert_chain", "key", "bundle"] {
            let path = str_at(&example, &format!("{role}.tls.{field}"));
            assert!(path.starts_with("/etc/waymark/tls/"), "{field} = {path}");
        }
        match role {
            "agent" => {
                assert_eq!(
                    unit_setting(&s, "ExecReload"),
                    Some("/bin/kill -HUP $MAINPID")
                );
                let stop = unit_setting(&s, "TimeoutStopSec").unwrap();
                let stop_s: u64 = stop.trim_end_matches('s').parse().unwrap();
                assert!(stop_s >= 30, "deregistration needs time to finish: {stop}");
                let services = str_at(&example, "agent.services_dir");
                assert!(services.starts_with("/etc/waymark/"), "{services}");
            }
            _ => {
                assert_eq!(
                    unit_setting(&s, "ExecReload"),
                    None,
                    "the authority does not handle SIGHUP: a reload would stop it"
                );
                // A member does not start without the file, so the unit's steps install it.
                let token = str_at(&example, "authority.acl.initial_management_token_file");
                assert!(
                    text.lines().any(|l| l.starts_with("#   install ")
                        && l.trim_end().ends_with(&format!(" {token}"))),
                    "{unit}'s steps do not install {token}"
                );
            }
        }
    }

    // `systemd-analyze verify` refuses a unit whose ExecStart binary is missing, and
    // /usr/local/bin/waymark is not installed here: verify a copy that starts this build.
    let found = Command::new("systemd-analyze").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "skipping `systemd-analyze verify`: systemd-analyze is not installed (Debian: \
             `apt-get install systemd`); the units' settings were still checked"
        );
        return;
    }
    for unit in ["waymark-agent.service", "waymark-authority.service"] {
        let tmp = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(dir.join(unit)).unwrap();
        assert!(text.contains("ExecStart=/usr/local/bin/waymark "));
        let copy = tmp.path().join(unit);
        std::fs::write(&copy, text.replace("/usr/local/bin/waymark", WAYMARK)).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Unknown keys and bad values are only warnings (exit 0): any line about our unit
        // fails the test. Lines about the host's own units are not ours to judge.
        let ours: Vec<&str> = stderr.lines().filter(|l| l.contains(unit)).collect();
        assert!(
            out.status.success() && ours.is_empty(),
            "systemd-analyze verify {unit}:\n{stderr}"
        );
    }
}
