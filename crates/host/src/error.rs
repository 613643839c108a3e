//! The one error type of the host crate.

use durability_alarms::AlarmError;
use durability_ownership::{DispatchOutcome, OwnershipError};
use durability_scheduler::{SchedulerError, StorageError, StorageErrorKind};

/// Trusted ownership errors that keep their code across hosts (each a
/// `503` with the marker); any other marked code or status becomes
/// `owner_unavailable`.
pub const TRUSTED_OWNERSHIP_CODES: &[&str] = &[
    "stale_owner",
    "owner_race",
    "draining",
    "lease_expired",
    "storage_inactive",
    "worker_delete_locked",
    "owner_store_unavailable",
];

/// The pre-dispatch subset: one router rediscovery is allowed after these,
/// for any method and RPC.
pub const REDISCOVERY_CODES: &[&str] = &["stale_owner", "owner_race"];

/// The longest method error message kept, in bytes (longer is cut at a
/// character boundary).
pub const MAX_METHOD_MESSAGE_BYTES: usize = 1024;

/// An error a method returns on purpose: its code, message and details
/// reach the caller unchanged, as [`HostError::Method`], on this host or
/// across hosts. The code uses `[a-z0-9_]`, 1..=64 bytes (else it is
/// downgraded to `internal_error`); the message is at most
/// [`MAX_METHOD_MESSAGE_BYTES`] (longer is truncated, on the host that ran
/// the method, so both paths see the same text).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct MethodError {
    /// The tenant's machine code.
    pub code: String,
    /// The tenant's message.
    pub message: String,
    /// Structured details (a typed method's error, encoded), if any.
    pub details: Option<serde_json::Value>,
}

impl MethodError {
    /// A method error with this code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            details: None,
        }
    }

    /// The same error with these details.
    #[must_use]
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Whether the code passes the grammar.
    pub fn code_is_valid(code: &str) -> bool {
        !code.is_empty()
            && code.len() <= 64
            && code
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    }
}

/// A boxed error from user code (a factory or a call body).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every failure of the host: configuration, lifecycle records, dispatch.
///
/// Each variant has a stable machine code ([`HostError::code`]), says
/// whether retrying can help ([`HostError::is_retryable`]) and whether the
/// refused work may have run ([`HostError::outcome`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A setting (a `DO_*` variable or a builder field) is invalid: the host
    /// refuses to start, before anything is opened, claimed or spawned.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting's name (`DO_PREVENT_EVICTION`, `storage_id`, ...).
        setting: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// The lifecycle record ownership needs is missing or names another
    /// storage: the host refuses to start.
    #[error(
        "lifecycle {lifecycle}: active storage pointer is {found}, expected {storage_id}; \
         {how_to_fix}"
    )]
    LifecycleRecord {
        /// The lifecycle whose pointer was read.
        lifecycle: String,
        /// The storage id this host serves.
        storage_id: String,
        /// What was found (`missing`, or the other storage id, or `whole-delete locked`).
        found: String,
        /// How to create or fix it.
        how_to_fix: String,
    },
    /// No object class of that name is configured.
    #[error("unknown object class {class}")]
    UnknownClass {
        /// The class asked for.
        class: String,
    },
    /// The class exists but its objects are of another Rust type than the
    /// call asked for.
    #[error("object class {class} is not of the requested type")]
    ClassType {
        /// The class asked for.
        class: String,
    },
    /// The object name (or the object id built from it) breaks a limit.
    #[error("invalid object name: {reason}")]
    InvalidObjectName {
        /// Why it was rejected.
        reason: String,
    },
    /// The host is draining or stopped: no new work is accepted.
    #[error("host is draining")]
    Draining,
    /// Another task owns the object's scope; calls between hosts are the
    /// transport's (not started here).
    #[error("object is owned by task {owner} at generation {generation}")]
    NotOwner {
        /// The owning task.
        owner: String,
        /// Its generation.
        generation: u64,
    },
    /// Owner resolution, fencing or admission refused the work (the
    /// ownership error says whether it started: see [`HostError::outcome`]).
    #[error("ownership refused the work: {0}")]
    Ownership(#[source] OwnershipError),
    /// The object's storage refused the commit: a newer claim is recorded in
    /// it, or this claim's lease budget was spent before the commit. Nothing
    /// of that transaction was written. Recognised anywhere in a handler's
    /// error chain ([`HostError::from_handler`]).
    #[error("commit refused by the storage fence: {0}")]
    Fenced(#[source] StorageError),
    /// Ownership moved while the work ran: the watchdog cancelled it. What
    /// it committed before stays committed; what it did not commit never
    /// will be. The outcome is unknown.
    #[error("ownership of {scope} was lost while the work ran")]
    OwnershipLost {
        /// The scope.
        scope: String,
    },
    /// The object's storage failed (not a fence refusal).
    #[error("object storage failed: {0}")]
    Storage(#[source] StorageError),
    /// The object's factory failed: the object was not opened.
    #[error("opening object {object} failed: {source}")]
    Factory {
        /// The object id.
        object: String,
        /// The factory's error.
        #[source]
        source: BoxError,
    },
    /// The call body failed (its own error).
    #[error("the call failed: {0}")]
    Handler(#[source] BoxError),
    /// A method returned its own [`MethodError`] (or a typed method's
    /// error, see [`crate::Method`]): the same variant, code, message and
    /// details whether the method ran on this host or on another one. The
    /// method ran: what it committed is its own (the outcome is unknown to
    /// the host).
    #[error("the method failed with {code}: {message}")]
    Method {
        /// The method's code (`[a-z0-9_]`, 1..=64 bytes).
        code: String,
        /// Its message (at most [`MAX_METHOD_MESSAGE_BYTES`]).
        message: String,
        /// Its details.
        details: Option<serde_json::Value>,
    },
    /// Wiring the object's alarm failed.
    #[error("object alarm failed: {0}")]
    Alarm(#[source] AlarmError),
    /// The object's stored schema is newer than this host's code (a host
    /// binary older than the one that last wrote the object): the object is
    /// not opened and nothing is changed, so replacing hosts one by one is
    /// safe; deploy the newer binary to serve it. Not retryable.
    #[error(
        "object schema of {capability:?} is stored at version {stored}, newer than this host's {latest}: deploy the newer host binary"
    )]
    SchemaAhead {
        /// The capability whose schema is ahead.
        capability: String,
        /// The stored version.
        stored: u32,
        /// The newest version this code knows.
        latest: u32,
    },
    /// The RPC method name breaks the identifier grammar or its length
    /// limit (refused before dispatch).
    #[error("invalid method name: {reason}")]
    InvalidMethod {
        /// Why it was rejected.
        reason: String,
    },
    /// The RPC arguments are not structural JSON within the limits
    /// (refused before dispatch).
    #[error("invalid arguments: {reason}")]
    InvalidArgs {
        /// Why they were rejected.
        reason: String,
    },
    /// The class registers no method of that name (refused before dispatch).
    #[error("object class {class} has no method {method}")]
    UnknownMethod {
        /// The class.
        class: String,
        /// The method asked for.
        method: String,
    },
    /// A fenced call reached a host that does not own the scope at the
    /// fence's generation (refused before dispatch; the caller may
    /// rediscover once).
    #[error("the route fence at generation {generation} is stale here")]
    StaleFence {
        /// The fence's generation.
        generation: u64,
    },
    /// No trusted answer came from the owner (a transport failure after
    /// the request was sent, a timeout, an unmarked 502/503/504): the
    /// method may have run, so it is not replayed.
    #[error("owner unavailable")]
    OwnerUnavailable {
        /// What happened (diagnostics; not part of the tenant message).
        reason: String,
    },
    /// The call never reached the owner (no internal token, no acceptable
    /// endpoint, or the connection could not be made): the method did not
    /// run, and calling again is safe. Its wire code is
    /// `owner_unavailable`, like [`HostError::OwnerUnavailable`].
    #[error("owner unreachable")]
    OwnerUnreachable {
        /// What happened (diagnostics; not part of the tenant message).
        reason: String,
    },
    /// The owner answered success but its body could not be read, decoded,
    /// parsed or validated: the method may have run; do not replay it
    /// blindly (`do_rpc_result_unknown`).
    #[error("the rpc result is unknown")]
    RpcResultUnknown {
        /// What happened (diagnostics).
        reason: String,
    },
    /// The owner answered with an error envelope: a trusted ownership code,
    /// the method's own [`crate::MethodError`] code, `internal_error`, or a
    /// refusal of the request.
    #[error("the owner answered {code}: {message}")]
    Remote {
        /// The HTTP status.
        status: u16,
        /// The envelope's code.
        code: String,
        /// Its message.
        message: String,
        /// Its details.
        details: Option<serde_json::Value>,
    },
    /// The transport (the HTTP server) failed.
    #[error("transport failed: {reason}")]
    Transport {
        /// What happened.
        reason: String,
    },
    /// A fetch request breaks a grammar rule (method, URL form, header
    /// name or value; see [`crate::fetch`]): refused before dispatch
    /// (`invalid_request`).
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// Why it was rejected.
        reason: String,
    },
    /// A fetch request breaks a size limit (URL, header count or bytes,
    /// body; see [`crate::fetch`]): refused before dispatch
    /// (`request_too_large`).
    #[error("request too large: {reason}")]
    RequestTooLarge {
        /// Why it was rejected.
        reason: String,
    },
    /// The SQLite object root, or the SQLite lease store's or alarm
    /// index's file, is on a network (or cluster, or FUSE) file system: the
    /// host refuses to start before anything is opened. SQLite files are
    /// for processes on one machine; hosts on several machines use
    /// PostgreSQL (`HostConfig::postgres`). The documented overrides, for a
    /// file system known to be safe for one machine's processes:
    /// `SqliteObjectStore::allow_network_file_system(true)` (the object
    /// root) and `HostConfig::allow_sqlite_stores_on_network_file_system(true)`
    /// (the lease store and alarm index).
    #[error(
        "{path} is on a {file_system} file system: {why}; use a local \
         disk, or PostgreSQL for hosts on several machines (HostConfig::postgres, \
         DO_DATABASE_URL); override, only for processes of one machine: \
         {override_with}"
    )]
    NetworkFileSystem {
        /// What is refused and where (`the object root /mnt/x`).
        path: String,
        /// The documented override.
        override_with: &'static str,
        /// The file system's name (`NFS`, `CIFS`, `FUSE`, ...).
        file_system: &'static str,
        /// Why it is refused.
        why: String,
    },
}

/// How an error crosses the wire: status, envelope code, message and
/// details, and whether it carries the trusted ownership marker.
#[derive(Debug, Clone, PartialEq)]
pub struct WireError {
    /// The HTTP status.
    pub status: u16,
    /// The envelope's `error`.
    pub code: String,
    /// The envelope's `message` (never task ids, endpoints or transport
    /// text).
    pub message: String,
    /// Whether the ownership marker is set.
    pub marked: bool,
    /// The envelope's `details` (a method's own error only).
    pub details: Option<serde_json::Value>,
}

/// The HTTP status of a method's own error on the wire (and only of it).
pub const METHOD_ERROR_STATUS: u16 = 422;

/// Codes of refusals that prove the request never started.
const NOT_STARTED_REMOTE: &[&str] = &[
    "invalid_method",
    "invalid_args",
    "unknown_method",
    "unknown_class",
    "invalid_object_name",
    "invalid_fence",
    "invalid_request",
    "request_too_large",
    "unauthorized",
];

impl HostError {
    /// Whether retrying (through a fresh owner resolution, possibly on
    /// another host) can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Draining
            | Self::NotOwner { .. }
            | Self::Fenced(_)
            | Self::OwnershipLost { .. }
            | Self::StaleFence { .. }
            | Self::OwnerUnavailable { .. }
            | Self::OwnerUnreachable { .. }
            | Self::Transport { .. } => true,
            Self::Remote { code, .. } => TRUSTED_OWNERSHIP_CODES.contains(&code.as_str()),
            Self::Ownership(e) => e.is_retryable(),
            Self::Storage(e) => e.kind() == StorageErrorKind::Backend,
            Self::Alarm(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// What the error proves about the work: refused before it started, or
    /// possibly run.
    pub fn outcome(&self) -> DispatchOutcome {
        match self {
            Self::Ownership(e) => e.outcome(),
            Self::OwnershipLost { .. }
            | Self::Handler(_)
            | Self::Method { .. }
            | Self::Storage(_)
            | Self::Alarm(_)
            | Self::OwnerUnavailable { .. }
            | Self::RpcResultUnknown { .. } => DispatchOutcome::Unknown,
            Self::Remote { code, .. }
                if !TRUSTED_OWNERSHIP_CODES.contains(&code.as_str())
                    && !NOT_STARTED_REMOTE.contains(&code.as_str()) =>
            {
                DispatchOutcome::Unknown
            }
            _ => DispatchOutcome::NotStarted,
        }
    }

    /// The ownership error inside, if any.
    pub fn ownership(&self) -> Option<&OwnershipError> {
        match self {
            Self::Ownership(e) => Some(e),
            _ => None,
        }
    }

    /// Classifies the error a handler body returned: a fence refusal
    /// anywhere in its error chain (a `StorageError` of kind `Fenced`,
    /// wrapped in the application's own error type or not) is
    /// [`HostError::Fenced`], so it stays recognised (nothing of that
    /// transaction was written); a bare `StorageError` is
    /// [`HostError::Storage`]; a [`MethodError`] with a valid code is
    /// [`HostError::Method`] (see [`HostError::method`]); anything else is
    /// the handler's own [`HostError::Handler`], its chain kept.
    pub fn from_handler(e: BoxError) -> Self {
        let e = match e.downcast::<StorageError>() {
            Ok(s) => return Self::from_storage(*s),
            Err(e) => e,
        };
        let e = match e.downcast::<MethodError>() {
            Ok(m) if MethodError::code_is_valid(&m.code) => return Self::method(*m),
            Ok(m) => m,
            Err(e) => e,
        };
        Self::from_handler_chain(&e).unwrap_or(Self::Handler(e))
    }

    /// [`HostError::Fenced`] when a fence refusal (a `StorageError` of kind
    /// `Fenced`) is anywhere in `e`'s error chain.
    pub(crate) fn from_handler_chain(e: &BoxError) -> Option<Self> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
        while let Some(c) = cause {
            if let Some(s) = c.downcast_ref::<StorageError>()
                && s.kind() == StorageErrorKind::Fenced
            {
                return Some(Self::Fenced(StorageError::new(
                    StorageErrorKind::Fenced,
                    e.to_string(),
                )));
            }
            cause = c.source();
        }
        None
    }

    /// A method's own error as the caller sees it: [`HostError::Method`]
    /// with its message cut to [`MAX_METHOD_MESSAGE_BYTES`] (at a character
    /// boundary). The one constructor of that variant, on the host that ran
    /// the method and on the one that decoded its answer.
    pub fn method(e: MethodError) -> Self {
        let MethodError {
            code,
            mut message,
            details,
        } = e;
        if message.len() > MAX_METHOD_MESSAGE_BYTES {
            let mut cut = MAX_METHOD_MESSAGE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Self::Method {
            code,
            message,
            details,
        }
    }

    /// Classifies a storage error: a fence refusal or another failure.
    pub fn from_storage(e: StorageError) -> Self {
        if e.kind() == StorageErrorKind::Fenced {
            Self::Fenced(e)
        } else {
            Self::Storage(e)
        }
    }

    pub(crate) fn from_scheduler(e: SchedulerError) -> Self {
        match e {
            SchedulerError::Storage(s) => Self::from_storage(s),
            SchedulerError::SchemaAhead {
                capability,
                stored,
                latest,
            } => Self::SchemaAhead {
                capability,
                stored,
                latest,
            },
            other => Self::Storage(StorageError::new(
                StorageErrorKind::Backend,
                other.to_string(),
            )),
        }
    }

    /// Classifies a failure wiring the object's alarm: a schema stored by
    /// newer code is [`HostError::SchemaAhead`].
    pub(crate) fn from_alarm(e: AlarmError) -> Self {
        match e {
            AlarmError::Schema(s) => Self::from_scheduler(s),
            other => Self::Alarm(other),
        }
    }

    /// Classifies a failing factory: a scheduler refusal of a schema
    /// stored by newer code anywhere in its error chain (a capability it
    /// attached) is [`HostError::SchemaAhead`]; anything else is
    /// [`HostError::Factory`].
    pub(crate) fn from_factory(object: String, source: BoxError) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
        while let Some(e) = cause {
            if let Some(SchedulerError::SchemaAhead {
                capability,
                stored,
                latest,
            }) = e.downcast_ref::<SchedulerError>()
            {
                return Self::SchemaAhead {
                    capability: capability.clone(),
                    stored: *stored,
                    latest: *latest,
                };
            }
            cause = e.source();
        }
        Self::Factory { object, source }
    }

    /// The envelope code a caller sees: the wire code for errors that
    /// crossed hosts (or would), else [`HostError::code`].
    pub fn rpc_code(&self) -> String {
        match self {
            Self::Remote { code, .. } | Self::Method { code, .. } => code.clone(),
            _ => self.wire().code,
        }
    }

    /// How this error crosses the wire (the owner's side): unknown internal
    /// failures become `internal_error`, trusted pre-dispatch ownership
    /// refusals keep their code with the marker, everything else about
    /// ownership becomes `owner_unavailable`; messages never carry task ids,
    /// endpoints or transport text.
    pub fn wire(&self) -> WireError {
        let w = |status: u16, code: &str, message: String, marked: bool| WireError {
            status,
            code: code.to_owned(),
            message,
            marked,
            details: None,
        };
        let unavailable = || {
            w(
                503,
                "owner_unavailable",
                "Owner unavailable".to_owned(),
                false,
            )
        };
        let refused = |code: &str| {
            w(
                503,
                code,
                "Ownership refused the call before dispatch".to_owned(),
                true,
            )
        };
        let internal = || w(500, "internal_error", "Internal error".to_owned(), false);
        match self {
            Self::InvalidMethod { .. } => w(400, "invalid_method", self.to_string(), false),
            Self::InvalidArgs { .. } => w(400, "invalid_args", self.to_string(), false),
            Self::UnknownMethod { .. } => w(404, "unknown_method", self.to_string(), false),
            Self::UnknownClass { .. } => w(404, "unknown_class", self.to_string(), false),
            Self::InvalidObjectName { .. } => {
                w(400, "invalid_object_name", self.to_string(), false)
            }
            Self::InvalidRequest { .. } => w(400, "invalid_request", self.to_string(), false),
            Self::RequestTooLarge { .. } => w(413, "request_too_large", self.to_string(), false),
            Self::Draining => refused("draining"),
            Self::StaleFence { .. } => refused("stale_owner"),
            Self::NotOwner { .. } => refused("owner_race"),
            Self::Ownership(e)
                if TRUSTED_OWNERSHIP_CODES.contains(&e.code())
                    && e.outcome() == DispatchOutcome::NotStarted =>
            {
                refused(e.code())
            }
            Self::Ownership(_)
            | Self::OwnershipLost { .. }
            | Self::Fenced(_)
            | Self::OwnerUnavailable { .. }
            | Self::OwnerUnreachable { .. } => unavailable(),
            Self::RpcResultUnknown { .. } => w(
                502,
                "do_rpc_result_unknown",
                "The rpc result is unknown".to_owned(),
                false,
            ),
            Self::Handler(e) => match e.downcast_ref::<MethodError>() {
                Some(m) if MethodError::code_is_valid(&m.code) => Self::method(m.clone()).wire(),
                _ => internal(),
            },
            Self::Method { code, .. } | Self::Remote { code, .. } => {
                let (status, message, details) = self.answered();
                let marked = status == 503 && TRUSTED_OWNERSHIP_CODES.contains(&code.as_str());
                WireError {
                    details,
                    ..w(status, code, message, marked)
                }
            }
            _ => internal(),
        }
    }

    /// The status, message and details of an answer (a method's own error
    /// or another host's envelope).
    fn answered(&self) -> (u16, String, Option<serde_json::Value>) {
        match self {
            Self::Method {
                message, details, ..
            } => (METHOD_ERROR_STATUS, message.clone(), details.clone()),
            Self::Remote {
                status,
                message,
                details,
                ..
            } => (*status, message.clone(), details.clone()),
            _ => (500, String::new(), None),
        }
    }

    /// An error envelope another host answered (not a trusted ownership
    /// refusal): a method's own error ([`METHOD_ERROR_STATUS`] with a valid
    /// code) is [`HostError::Method`], as it was on the owner; anything
    /// else is [`HostError::Remote`].
    pub(crate) fn remote(
        status: u16,
        code: String,
        message: String,
        details: Option<serde_json::Value>,
    ) -> Self {
        if status == METHOD_ERROR_STATUS && MethodError::code_is_valid(&code) {
            return Self::method(MethodError {
                code,
                message,
                details,
            });
        }
        Self::Remote {
            status,
            code,
            message,
            details,
        }
    }

    /// A trusted ownership refusal returned by another host: its code is
    /// kept only when allowlisted, its message replaced.
    pub(crate) fn remote_ownership(code: &str) -> Self {
        if TRUSTED_OWNERSHIP_CODES.contains(&code) {
            Self::Remote {
                status: 503,
                code: code.to_owned(),
                message: "Ownership refused the call before dispatch".to_owned(),
                details: None,
            }
        } else {
            Self::OwnerUnavailable {
                reason: format!("untrusted ownership code {code}"),
            }
        }
    }

    pub(crate) fn setting(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }
}

durability_time::error_codes! {
    HostError {
        Self::InvalidSetting { .. } => "host_invalid_setting",
        Self::LifecycleRecord { .. } => "host_lifecycle_record",
        Self::UnknownClass { .. } => "host_unknown_class",
        Self::ClassType { .. } => "host_class_type",
        Self::InvalidObjectName { .. } => "host_invalid_object_name",
        Self::Draining => "host_draining",
        Self::NotOwner { .. } => "host_not_owner",
        Self::Ownership(_) => "host_ownership_refused",
        Self::Fenced(_) => "host_fenced",
        Self::OwnershipLost { .. } => "host_ownership_lost",
        Self::Storage(_) => "host_storage_failed",
        Self::Factory { .. } => "host_factory_failed",
        Self::Handler(_) => "host_handler_failed",
        Self::Method { .. } => "host_method_error",
        Self::Alarm(_) => "host_alarm_failed",
        Self::SchemaAhead { .. } => "host_schema_ahead",
        Self::InvalidMethod { .. } => "host_invalid_method",
        Self::InvalidArgs { .. } => "host_invalid_args",
        Self::UnknownMethod { .. } => "host_unknown_method",
        Self::StaleFence { .. } => "host_stale_fence",
        Self::OwnerUnavailable { .. } | Self::OwnerUnreachable { .. } => "owner_unavailable",
        Self::RpcResultUnknown { .. } => "do_rpc_result_unknown",
        Self::Remote { .. } => "host_remote_error",
        Self::Transport { .. } => "host_transport_failed",
        Self::InvalidRequest { .. } => "host_invalid_request",
        Self::RequestTooLarge { .. } => "host_request_too_large",
        Self::NetworkFileSystem { .. } => "host_network_file_system",
    }
}

impl From<OwnershipError> for HostError {
    fn from(e: OwnershipError) -> Self {
        Self::Ownership(e)
    }
}

impl From<StorageError> for HostError {
    fn from(e: StorageError) -> Self {
        Self::from_storage(e)
    }
}
