//! The material in force, swappable at run time: what the TLS configs (`tls`) and the peer
//! verifier (`verify`) read on every handshake, and what the reloader replaces.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::material::Material;

/// The material being served, swappable at run time.
#[derive(Debug)]
pub struct LiveMaterial {
    current: RwLock<Arc<Material>>,
    generation: AtomicU64,
}

// === impl LiveMaterial ===

impl LiveMaterial {
    /// Starts serving `material` at generation 0.
    pub fn new(material: Material) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(material)),
            generation: AtomicU64::new(0),
        })
    }

    /// The material in force now.
    pub fn current(&self) -> Arc<Material> {
        // A poisoned lock still holds a whole `Arc`: writers only ever assign one.
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the material; returns the new generation. Connections opened afterwards
    /// use it.
    pub fn swap(&self, material: Material) -> u64 {
        let mut guard = self.current.write().unwrap_or_else(PoisonError::into_inner);
        *guard = Arc::new(material);
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// How many swaps have happened.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}
