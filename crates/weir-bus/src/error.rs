//! Errors of the HTTP API: a status and a message, sent as `{"error": MESSAGE}`.
//!
//! Every refusal says what was wrong in words a client can act on; a failure of the
//! storage backend or the disk is a 500 (507 when the disk is full; 503 when a queue
//! or the store is full, or the backend is closed or out of reach) whose detail goes
//! to the log, not to the client. The status is read from the failure's
//! [`weir_backend::Kind`] alone, whichever backend said it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, message)
    }

    /// This instance does not serve the bus now (another instance does, on the same
    /// cluster): 503, worth a retry here or at the instance that serves.
    pub fn standby() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this instance stands by: another weir instance on the cluster serves the bus",
        )
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
    }

    /// A failure of the backend or the disk: logged with `context`, answered 500
    /// (507 when the disk is full, 503 when a queue or the store is full or closed, or
    /// the backend out of reach: each worth a retry later).
    pub fn engine(context: &str, e: &weir_backend::Error) -> ApiError {
        use weir_backend::Kind;
        let (status, tell) = match e.kind() {
            Kind::DiskFull => (StatusCode::INSUFFICIENT_STORAGE, true),
            Kind::TooManyQueues | Kind::Full => (StatusCode::SERVICE_UNAVAILABLE, true),
            Kind::Closed | Kind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, false),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, false),
        };
        tracing::error!(error = %e, "{context}");
        // A limit the client can act on is named; other failures stay in the log.
        let message = if tell {
            format!("{context}: {e}")
        } else {
            format!("{context}: storage error")
        };
        ApiError::new(status, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message }).to_string();
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
        }
        response
    }
}
