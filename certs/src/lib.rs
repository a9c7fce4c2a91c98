//! waymark's trust layer.
//!
//! Will hold: SVID-shaped workload identities (`spiffe://<td>/region/<r>/node/<n>` and
//! friends) parsed strictly as types, a small CA that issues short-lived leaves, rustls
//! server and client configurations that require and verify client certificates over TCP
//! (tonic) and QUIC (quinn), a reloader for rotation without restart, and the pure
//! attribution checks ("may X report about Y?").
#![forbid(unsafe_code)]
