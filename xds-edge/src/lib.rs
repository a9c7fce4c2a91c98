//! waymark's xDS edge.
//!
//! Will hold: the ADS server and client (Delta and State-of-the-World) serving CDS and
//! EDS, the LRS server that ingests Envoy's load reports, and the translation from
//! `waymark_core` views to Envoy resources (eligibility → health status and weight,
//! tiers → EDS priorities, markers → metadata). Both hops use it: authority → node agent,
//! node agent → sidecar.
//!
//! Nothing is built here yet; the pure view and delta machinery it will serve lives in
//! `waymark_core`.
#![forbid(unsafe_code)]
