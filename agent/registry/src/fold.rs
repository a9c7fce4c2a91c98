//! Refusals folded per (who, why) between flushes, so that whatever rate a principal or
//! reporter is refused at, the replicated audit log grows by one record per pair and
//! flush, carrying the count and one example. Pure: the callers turn what is drained into
//! audit records at a time they pass in.

use std::collections::BTreeMap;

use waymark_core::model::ServiceName;

/// Distinct (who, why) pairs held between flushes; refusals beyond are counted only.
pub const KEYS_MAX: usize = 1_024;

/// One pair's refusals since the last flush.
#[derive(Debug)]
pub struct Folded {
    /// How many.
    pub count: u64,
    /// The first one's example (truncated).
    pub example: String,
    /// The service the first one concerned, if any.
    pub service: Option<ServiceName>,
}

/// What a flush takes: every pair folded, and how many refusals did not fit.
pub type Drained = (Vec<((String, String), Folded)>, u64);

/// The fold itself.
#[derive(Debug)]
pub struct Fold {
    pending: BTreeMap<(String, String), Folded>,
    overflow: u64,
    example_max: usize,
}

impl Fold {
    /// A fold keeping examples of at most `example_max` bytes.
    pub fn new(example_max: usize) -> Self {
        Self {
            pending: BTreeMap::new(),
            overflow: 0,
            example_max,
        }
    }

    /// Count one refusal of `who` for `why`.
    pub fn add(&mut self, who: String, why: String, example: String, service: Option<ServiceName>) {
        let key = (who, why);
        if let Some(f) = self.pending.get_mut(&key) {
            f.count = f.count.saturating_add(1);
            return;
        }
        if self.pending.len() >= KEYS_MAX {
            self.overflow = self.overflow.saturating_add(1);
            return;
        }
        let mut example = example;
        if example.len() > self.example_max {
            let mut end = self.example_max;
            while !example.is_char_boundary(end) {
                end -= 1;
            }
            example.truncate(end);
        }
        self.pending.insert(
            key,
            Folded {
                count: 1,
                example,
                service,
            },
        );
    }

    /// Whether anything waits to be flushed.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.overflow == 0
    }

    /// Everything folded since the last flush, and the overflow count; empties the fold.
    pub fn drain(&mut self) -> Drained {
        (
            std::mem::take(&mut self.pending).into_iter().collect(),
            std::mem::take(&mut self.overflow),
        )
    }
}
