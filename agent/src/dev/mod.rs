//! `waymark dev`: a whole region in one process, and the demo backends it runs.
pub mod backends;
