//! DNS over the last-known-good view (filled in by the DNS work).
