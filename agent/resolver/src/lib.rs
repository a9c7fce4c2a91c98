//! waymark-resolver: in-process resolution from the local agent's views.
#![forbid(unsafe_code)]
