//! HTTP errors in Dapr's shape: `{"errorCode": "...", "message": "..."}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::dapr::DaprError;
use crate::engine::EngineError;

/// Dapr's error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    #[serde(rename = "errorCode")]
    pub error_code: String,
    pub message: String,
}

/// Which operation failed: it picks the Dapr error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Get,
    BulkGet,
    Save,
    Delete,
    Transaction,
    Query,
    Subscribe,
    List,
    TryLock,
    Unlock,
    ConfigurationGet,
    ConfigurationSubscribe,
    ConfigurationUnsubscribe,
    Import,
    /// Leader election (a stategate extension over lock stores).
    Election,
}

impl Op {
    fn code(self) -> &'static str {
        match self {
            Op::Get | Op::Subscribe | Op::List => "ERR_STATE_GET",
            Op::BulkGet => "ERR_STATE_BULK_GET",
            Op::Save => "ERR_STATE_SAVE",
            Op::Delete => "ERR_STATE_DELETE",
            Op::Transaction => "ERR_STATE_TRANSACTION",
            Op::Query => "ERR_STATE_QUERY",
            Op::Import => "ERR_STATE_IMPORT",
            Op::TryLock => "ERR_TRY_LOCK",
            Op::Unlock => "ERR_UNLOCK",
            Op::ConfigurationGet => "ERR_CONFIGURATION_GET",
            Op::ConfigurationSubscribe => "ERR_CONFIGURATION_SUBSCRIBE",
            Op::ConfigurationUnsubscribe => "ERR_CONFIGURATION_UNSUBSCRIBE",
            Op::Election => "ERR_ELECTION",
        }
    }

    /// daprd's code for a store name it does not know, per building block.
    fn store_not_found(self) -> &'static str {
        match self {
            Op::Get
            | Op::BulkGet
            | Op::Save
            | Op::Delete
            | Op::Transaction
            | Op::Query
            | Op::Subscribe
            | Op::List
            | Op::Import => "ERR_STATE_STORE_NOT_FOUND",
            Op::TryLock | Op::Unlock | Op::Election => "ERR_LOCK_STORE_NOT_FOUND",
            Op::ConfigurationGet | Op::ConfigurationSubscribe | Op::ConfigurationUnsubscribe => {
                "ERR_CONFIGURATION_STORE_NOT_FOUND"
            }
        }
    }
}

/// An error on its way to the client.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

pub const MALFORMED: &str = "ERR_MALFORMED_REQUEST";

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, MALFORMED, message)
    }

    /// Maps a Dapr-layer error for operation `op`. Exhaustive: a new variant must be mapped here.
    pub fn from_dapr(op: Op, err: DaprError) -> ApiError {
        let tx = op == Op::Transaction;
        match err {
            DaprError::StoreNotFound { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, op.store_not_found(), err.to_string())
            }
            DaprError::Malformed(m) => ApiError::malformed(m),
            DaprError::InvalidEtag(_) if tx => ApiError::malformed(err.to_string()),
            DaprError::InvalidEtag(_) => ApiError::new(StatusCode::BAD_REQUEST, op.code(), err.to_string()),
            DaprError::EtagMismatch(_) if tx => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, op.code(), err.to_string())
            }
            DaprError::EtagMismatch(_) => ApiError::new(StatusCode::CONFLICT, op.code(), err.to_string()),
            DaprError::UnsupportedOperation(_) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "ERR_NOT_SUPPORTED_STATE_OPERATION",
                err.to_string(),
            ),
            DaprError::TooManyOperations { .. } => ApiError::new(
                StatusCode::BAD_REQUEST,
                "ERR_STATE_STORE_TOO_MANY_TRANSACTIONS",
                err.to_string(),
            ),
            DaprError::Engine(e) => ApiError::from_engine(op, e),
        }
    }

    /// Maps an engine error for operation `op`. Exhaustive, no `_` arm.
    pub fn from_engine(op: Op, err: EngineError) -> ApiError {
        let tx = op == Op::Transaction;
        let message = err.to_string();
        match err {
            EngineError::UnknownCommand
            | EngineError::WrongArity
            | EngineError::Syntax
            | EngineError::EmptyKey
            | EngineError::MissingTimestamp
            | EngineError::MalformedTimestamp
            | EngineError::TimestampSkew
            | EngineError::FencingTokenSkew => ApiError::malformed(message),
            EngineError::FencingTokenRequired | EngineError::FencingTokenLower | EngineError::VersionMismatch if tx => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, op.code(), message)
            }
            EngineError::FencingTokenRequired | EngineError::FencingTokenLower | EngineError::VersionMismatch => {
                ApiError::new(StatusCode::CONFLICT, op.code(), message)
            }
            EngineError::TooLarge => ApiError::malformed("the key or value is larger than the configured limit"),
            EngineError::TtlOutOfRange => ApiError::malformed(message),
            EngineError::QuotaExceeded if tx => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, op.code(), message),
            EngineError::QuotaExceeded => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, op.code(), message),
            // Only MQTT asks for persistence today; answered as the refused request it is.
            EngineError::NotPersistent if tx => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, op.code(), message),
            EngineError::NotPersistent => ApiError::new(StatusCode::BAD_REQUEST, op.code(), message),
            EngineError::NotAuthorized => ApiError::new(StatusCode::FORBIDDEN, "ERR_PERMISSION_DENIED", message),
            EngineError::RateLimited => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "ERR_TOO_MANY_REQUESTS", message),
            EngineError::Unavailable => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, op.code(), message),
            EngineError::StorageFull => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, op.code(), message),
            EngineError::Storage(e) => {
                tracing::error!(cause = %e, ?op, "http: storage failure");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, op.code(), "the state store failed")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error_code: self.code.to_owned(),
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}
