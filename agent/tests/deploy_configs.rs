//! Every example configuration in `deploy/` parses with the binary's own `--print-config`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

fn print_config(role: &str, file: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args([role, "--config"])
        .arg(file)
        .arg("--print-config")
        .env_remove("WAYMARK_AGENT_ZONE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_example_configuration_parses() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut checked = 0;
    for (role, dir) in [("agent", "agent"), ("authority", "authority")] {
        for entry in std::fs::read_dir(deploy.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let printed = print_config(role, &path);
                assert!(printed.contains(&format!("[{role}]")), "{printed}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "no example configurations found");
}

#[test]
fn a_bad_configuration_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[agent]\nname = \"n1\"\nregion = \"eu\"\nzone = \"a\"\ndata_dir = \"/tmp/x\"\nupstream = []\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["agent", "--config"])
        .arg(&path)
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent.upstream"));
}

#[test]
fn example_service_definitions_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agent/services.d");
    let defs = waymark_agent::node::registration::read_definitions(&dir).unwrap();
    assert!(!defs.is_empty(), "no example service definitions");
}

#[path = "../../xds-edge/tests/support/mod.rs"]
mod support;

#[test]
fn every_envoy_bootstrap_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/envoy");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let out = Command::new(support::envoy_bin())
                .args(["--mode", "validate", "-c"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{} does not validate:\n{}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 1, "no Envoy bootstraps found");
}
