//! TCP check: a completed connect passes. The connection is closed at once.

use std::net::SocketAddr;

use tokio::net::TcpStream;

use super::check::{Outcome, ProbeError};

/// Connect to `addr`; the caller bounds the time.
pub(super) async fn probe(addr: SocketAddr) -> Result<Outcome, ProbeError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(ProbeError::Connect)?;
    drop(stream);
    Ok(Outcome::pass())
}
