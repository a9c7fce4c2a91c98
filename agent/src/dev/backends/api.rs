//! The control API: list the backends, switch their modes. JSON in and out; every refusal is
//! `{"error": "<message>"}` and changes nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{BackendError, BackendStatus, Backends, Mode};

/// Body limit of the control API (a mode is one short word); `413` beyond.
const BODY_MAX: usize = 1024;

// === impl Backends ===

impl Backends {
    /// The control API, for nesting into the dev process's API:
    ///
    /// - `GET /v1/dev/backends` → `200 {"backends": [BackendStatus, …]}`, ordered by instance.
    /// - `PUT /v1/dev/backends/{instance}/mode` with `{"mode": "slow"}` (any [`Mode`]
    ///   spelling; no content type required) → `200` and the backend's [`BackendStatus`].
    ///   `PUT` because the call sets state and repeating it is harmless.
    ///
    /// Refusals are `{"error": "<message>"}`: `404` for an unknown instance, `400` for a
    /// malformed body or unknown mode, `503` when the port cannot be re-bound (retry later)
    /// or the backends are shut down.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/dev/backends", get(list))
            .route("/v1/dev/backends/{instance}/mode", put(set_mode))
            .layer(DefaultBodyLimit::max(BODY_MAX))
            .with_state(self)
    }
}

#[derive(Serialize)]
struct List {
    backends: Vec<BackendStatus>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModeBody {
    mode: Mode,
}

async fn list(State(backends): State<Arc<Backends>>) -> Json<List> {
    Json(List {
        backends: backends.status(),
    })
}

async fn set_mode(
    State(backends): State<Arc<Backends>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<BackendStatus>, ApiError> {
    let Path(instance) = path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    // The resource's existence first: a bad body for a missing backend is still a 404.
    let Some(backend) = backends.backends.get(&instance) else {
        return Err(ApiError::from(BackendError::UnknownInstance { instance }));
    };
    let ModeBody { mode } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("malformed body (expected {{\"mode\": \"<mode>\"}}): {e}"),
        )
    })?;
    backends.set_mode(&instance, mode)?;
    Ok(Json(backend.status()))
}

/// A refusal: a status and a one-line message.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<BackendError> for ApiError {
    fn from(error: BackendError) -> Self {
        let status = match &error {
            BackendError::UnknownInstance { .. } => StatusCode::NOT_FOUND,
            BackendError::Rebind { .. } | BackendError::ShutDown => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // The whole chain: a re-bind failure is only useful with its socket error.
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::new(status, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        tracing::debug!(status = self.status.as_u16(), error = %self.message, "dev backend api request refused");
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}
