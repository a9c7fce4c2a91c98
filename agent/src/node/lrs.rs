//! Load reports from the host's Envoys, aggregated and forwarded as passive evidence.
