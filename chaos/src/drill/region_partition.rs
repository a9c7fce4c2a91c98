//! `region-partition` (being written).
use std::path::Path;

use serde::Serialize;

use super::Scale;
use super::figures::Verdict;

#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    pub partition_s: u64,
    pub rate: u32,
    pub seed: u64,
    pub break_stale_drop: bool,
}

impl Params {
    pub fn for_scale(scale: Scale) -> Self {
        Self {
            scale,
            partition_s: 20,
            rate: 20,
            seed: 1,
            break_stale_drop: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub verdict: Verdict,
}

pub async fn run(_params: Params, _run_dir: &Path) -> anyhow::Result<Report> {
    anyhow::bail!("not yet")
}
