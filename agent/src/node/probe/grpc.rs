//! gRPC check: `grpc.health.v1.Health/Check` over a fresh channel; `SERVING` passes.

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::check::{GrpcCheck, Outcome, ProbeError};

/// Ask `addr` about `check.service`; the caller bounds the time, and `timeout` also rides
/// on the request as `grpc-timeout` so the server can give up with us.
pub(super) async fn probe(
    addr: SocketAddr,
    check: &GrpcCheck,
    timeout: Duration,
) -> Result<Outcome, ProbeError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(ProbeError::Transport)?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint.connect().await.map_err(ProbeError::Transport)?;
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: check.service.clone(),
    });
    request.set_timeout(timeout);
    let response = HealthClient::new(channel)
        .check(request)
        .await
        .map_err(ProbeError::Status)?;
    Ok(Outcome::of_grpc_status(response.into_inner().status))
}
