//! waymark-core (being written).
#![forbid(unsafe_code)]
pub mod defaults {
    //! Platform defaults.
    /// Describe the defaults.
    pub fn describe() -> String {
        String::new()
    }
}
