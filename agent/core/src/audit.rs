//! Audit records and explanations: every transition says what decided it.
//!
//! A [`TransitionRecord`] is emitted (as an effect) for every change of coarse verdict; the
//! shell appends it to the durable audit log. [`Explanation`] answers "why is this instance
//! in this state?" from the evaluator's current evidence plus its recent transitions, so
//! `waymark explain` never has to guess.

use std::time::{Duration, Instant};

use crate::eligibility::{Eligibility, EvidenceMode, Rule, Verdict};
use crate::model::{DependencyStatus, EvidenceClass, InstanceId, Reporter, ServiceName};
use crate::units::Permille;

/// Check output and self-report details are cut to this many bytes.
pub const DETAIL_LEN_MAX: usize = 256;

/// One class's evidence at the moment of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassEvidence {
    /// The class.
    pub class: EvidenceClass,
    /// Whether the capability profile provides it.
    pub provided: bool,
    /// The decaying failure score.
    pub score: Permille,
    /// No sample within its silence interval.
    pub silent: bool,
    /// Time since its last sample.
    pub age: Option<Duration>,
    /// Who sent the last sample.
    pub reporter: Option<Reporter>,
    /// A one-line summary of the last sample (check output truncated).
    pub last: Option<String>,
}

/// One change of verdict, with the evidence that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionRecord {
    /// When.
    pub at: Instant,
    /// Which instance.
    pub instance: InstanceId,
    /// Its service.
    pub service: ServiceName,
    /// The verdict before (`None` for a new instance).
    pub from: Option<Verdict>,
    /// The verdict after.
    pub to: Verdict,
    /// The full eligibility after.
    pub eligibility: Eligibility,
    /// The rule that fired.
    pub rule: Rule,
    /// Each class's evidence at that moment.
    pub evidence: Vec<ClassEvidence>,
}

/// Why an instance is where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// Which instance.
    pub instance: InstanceId,
    /// Its service.
    pub service: ServiceName,
    /// The current eligibility.
    pub eligibility: Eligibility,
    /// The rule that produced it.
    pub rule: Rule,
    /// What the verdict rests on now (ADR-04).
    pub mode: EvidenceMode,
    /// How long it has held this verdict.
    pub for_duration: Duration,
    /// Evidence per class.
    pub classes: Vec<ClassEvidence>,
    /// Latest reported condition of each dependency, with whether it is shared.
    pub dependencies: Vec<(String, DependencyStatus, bool)>,
    /// Transitions in the current flap window.
    pub flap_transitions: usize,
    /// Quarantines served so far without a reset (the backoff level).
    pub quarantine_level: u32,
    /// Recent transitions, oldest first.
    pub history: Vec<TransitionRecord>,
}

/// Cut `text` to [`DETAIL_LEN_MAX`] bytes on a character boundary.
pub fn truncate_detail(text: &str) -> String {
    if text.len() <= DETAIL_LEN_MAX {
        return text.to_owned();
    }
    let mut end = DETAIL_LEN_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "instance {} of {}", self.instance, self.service)?;
        writeln!(
            f,
            "verdict  {} for {:?} (rule {}); evidence {}",
            self.eligibility.verdict(),
            self.for_duration,
            self.rule,
            self.mode
        )?;
        for c in &self.classes {
            let state = match (c.provided, c.silent) {
                (false, _) => "not provided".to_owned(),
                (true, true) => "silent".to_owned(),
                (true, false) => format!("score {}", c.score),
            };
            writeln!(
                f,
                "  {:<12} {:<14} last {:?} ago from {} : {}",
                c.class.as_str(),
                state,
                c.age.unwrap_or_default(),
                c.reporter
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), ToString::to_string),
                c.last.as_deref().unwrap_or("-"),
            )?;
        }
        for (name, status, shared) in &self.dependencies {
            let kind = if *shared { "shared" } else { "own" };
            writeln!(f, "  dependency {name} ({kind}): {status:?}")?;
        }
        writeln!(
            f,
            "  flap window: {} transitions; quarantine level {}",
            self.flap_transitions, self.quarantine_level
        )?;
        for t in &self.history {
            let from = t.from.map_or("-", Verdict::as_str);
            writeln!(f, "  transition {from} -> {} by {}", t.to, t.rule)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_details_are_cut_on_a_character_boundary() {
        let text = "é".repeat(DETAIL_LEN_MAX);
        let cut = truncate_detail(&text);
        assert!(cut.len() <= DETAIL_LEN_MAX + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(truncate_detail("short"), "short");
    }
}
