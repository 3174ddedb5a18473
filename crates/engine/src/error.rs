//! The one error type of the engine. Every front end maps it with an exhaustive `match`
//! (no `_ =>` arm), so a new variant does not build until each door handles it.

use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The verb is not one the state store knows.
    #[error("unknown command")]
    UnknownCommand,
    /// Too few or too many arguments for the verb.
    #[error("wrong number of arguments")]
    WrongArity,
    /// An unknown option, conflicting options, a bad number, a bad pattern or token.
    #[error("syntax error")]
    Syntax,
    #[error("the key length is zero")]
    EmptyKey,
    /// A write that needs a request timestamp came without one.
    #[error("missing timestamp")]
    MissingTimestamp,
    /// A request timestamp or fencing token that is not an HLC.
    #[error("malformed timestamp")]
    MalformedTimestamp,
    #[error(
        "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
    )]
    TimestampSkew,
    #[error("a fencing token is required for this request")]
    FencingTokenRequired,
    #[error(
        "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
    )]
    FencingTokenSkew,
    #[error("the request fencing token is a lower version than the fencing token protecting the resource")]
    FencingTokenLower,
    /// Too many keys, or too many keys observed by one client.
    #[error("the quota has been exceeded")]
    QuotaExceeded,
    /// A key or value over its size limit (over MQTT the same quota error; over HTTP and gRPC
    /// it is the caller's input that is wrong, not the store that is full).
    #[error("the quota has been exceeded")]
    TooLarge,
    /// A time to live outside 1 ms ..= [`crate::MAX_TTL_MS`] (over MQTT the syntax
    /// error every client knows, as a bad `PX` always was).
    #[error("the time to live must be from 1 millisecond to 100 years")]
    TtlOutOfRange,
    /// A write conditioned on a version (an ETag) found another version or no key.
    #[error("the stored version does not match the requested version")]
    VersionMismatch,
    /// A SET asked to be kept on persistent storage (`aio-persistence`) and the storage keeps
    /// nothing beyond the process (`--storage memory`): refused rather than pretended.
    #[error("persistence is not available: this state store keeps keys in memory only")]
    NotPersistent,
    /// The caller's principal may not do this to this key (access rules).
    #[error("not authorized")]
    NotAuthorized,
    /// The caller's principal sent more requests than its rate allows.
    #[error("too many requests; slow down")]
    RateLimited,
    /// The storage cannot be reached right now (a lost connection); retrying later may work.
    #[error("the storage is unavailable; retry later")]
    Unavailable,
    /// The storage has no space left: writes are refused until space is freed, reads still work.
    #[error("the storage is full; writes are refused until space is freed")]
    StorageFull,
    /// The storage failed; the details are logged, never sent to clients.
    #[error("storage failure")]
    Storage(StorageError),
}

impl From<StorageError> for EngineError {
    /// Conditions a client can act on get their own variant; everything else is a fault.
    fn from(e: StorageError) -> EngineError {
        match e {
            StorageError::Unavailable(_) => EngineError::Unavailable,
            StorageError::Full(_) => EngineError::StorageFull,
            other => EngineError::Storage(other),
        }
    }
}
