//! Engine and Dapr-layer errors as gRPC statuses. Exhaustive matches, no `_` arm.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::dapr::DaprError;
use crate::engine::EngineError;

/// Which gRPC surface answers: the codes differ slightly between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `statestore.v1`.
    Native,
    /// `dapr.proto.runtime.v1.Dapr`; `transaction` marks ExecuteStateTransaction.
    Runtime { transaction: bool },
    /// `dapr.proto.components.v1` (what daprd expects from a pluggable component).
    Component,
}

/// The MQTT error text travels as the message, so every door says the same thing.
pub fn from_engine(surface: Surface, err: EngineError) -> Status {
    let msg = err.to_string();
    let tx = matches!(surface, Surface::Runtime { transaction: true });
    match err {
        EngineError::UnknownCommand
        | EngineError::WrongArity
        | EngineError::Syntax
        | EngineError::EmptyKey
        | EngineError::MissingTimestamp
        | EngineError::MalformedTimestamp
        | EngineError::TimestampSkew
        | EngineError::FencingTokenSkew => Status::invalid_argument(msg),
        EngineError::FencingTokenRequired | EngineError::FencingTokenLower => match surface {
            Surface::Native | Surface::Component => Status::failed_precondition(msg),
            Surface::Runtime { .. } if tx => Status::internal(msg),
            Surface::Runtime { .. } => Status::aborted(msg),
        },
        EngineError::VersionMismatch => match surface {
            Surface::Component => etag_status(Code::FailedPrecondition, msg),
            Surface::Runtime { .. } if tx => Status::internal(msg),
            Surface::Native | Surface::Runtime { .. } => Status::aborted(msg),
        },
        EngineError::TooLarge => Status::invalid_argument("the key or value is larger than the configured limit"),
        EngineError::TtlOutOfRange => Status::invalid_argument(msg),
        EngineError::QuotaExceeded if tx => Status::internal(msg),
        EngineError::QuotaExceeded => Status::resource_exhausted(msg),
        // The storage cannot do what was asked: a precondition of the deployment, not input.
        EngineError::NotPersistent if tx => Status::internal(msg),
        EngineError::NotPersistent => Status::failed_precondition(msg),
        EngineError::NotAuthorized => Status::permission_denied(msg),
        EngineError::RateLimited | EngineError::StorageFull => Status::resource_exhausted(msg),
        EngineError::Unavailable => Status::unavailable(msg),
        EngineError::Storage(e) => {
            tracing::error!(cause = %e, ?surface, "grpc: storage failure");
            Status::internal("storage failure")
        }
    }
}

pub fn from_dapr(surface: Surface, err: DaprError) -> Status {
    let msg = err.to_string();
    let tx = matches!(surface, Surface::Runtime { transaction: true });
    match err {
        DaprError::StoreNotFound { .. }
        | DaprError::Malformed(_)
        | DaprError::UnsupportedOperation(_)
        | DaprError::TooManyOperations { .. } => Status::invalid_argument(msg),
        DaprError::InvalidEtag(_) => match surface {
            Surface::Component => etag_status(Code::InvalidArgument, msg),
            Surface::Native | Surface::Runtime { .. } => Status::invalid_argument(msg),
        },
        DaprError::EtagMismatch(_) => match surface {
            Surface::Component => etag_status(Code::FailedPrecondition, msg),
            Surface::Runtime { .. } if tx => Status::internal(msg),
            Surface::Native | Surface::Runtime { .. } => Status::aborted(msg),
        },
        DaprError::Engine(e) => from_engine(surface, e),
    }
}

/// The component contract: one `google.rpc.BadRequest` detail whose violation names `etag`.
fn etag_status(code: Code, msg: String) -> Status {
    Status::with_error_details(code, msg.clone(), ErrorDetails::with_bad_request_violation("etag", msg))
}
