//! Demo backends for `waymark dev` and the drills.
