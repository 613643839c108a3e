//! Request ids: best-effort, untrusted diagnostic metadata that follows a
//! request across hosts and into nested calls.
//!
//! - **At the edge** (a tenant's fetch or connect entering
//!   [`crate::ObjectRef`] outside any object), the tenant's
//!   [`REQUEST_ID_HEADER`] is accepted only when it passes
//!   [`RequestId::sanitize`] (1..=[`MAX_REQUEST_ID_BYTES`] bytes of
//!   `[A-Za-z0-9._:/+=@-]`); anything else (oversized, control characters,
//!   other bytes) is replaced by a generated id. A call with no id (RPC,
//!   alarm deliveries, the host's own API) gets a generated one.
//! - **Nested calls** (made while an object's method, fetch, connect or
//!   alarm handler runs on this task) discard any tenant-supplied
//!   [`REQUEST_ID_HEADER`] and carry the context id instead.
//! - **Internal hops** never forward the tenant's header: the tenant's
//!   [`REQUEST_ID_HEADER`] entries are removed from the request the router
//!   carries, and the sanitized context id travels in
//!   [`CONTEXT_ID_HEADER`] (under the control prefix, so a tenant cannot
//!   forge it: control headers are stripped from tenant requests). The
//!   receiver sanitizes it again (else generates one).
//! - Handlers (methods, fetch, connect, alarms) read the context id with
//!   [`RequestId::current`]; a fetch or connect handler never sees a
//!   [`REQUEST_ID_HEADER`] (the router removed it). The host's spans for calls, fetches, connects,
//!   dispatch and alarm deliveries carry it as the `request_id` field.
//!
//! The context is task-local: a handler's nested call on the same task
//! carries it; work the handler spawns onto another task starts without
//! one (and gets a generated id).

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The tenant-facing request id header.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The internal hop's sanitized context id (a control header).
pub const CONTEXT_ID_HEADER: &str = "x-durability-request-id";
/// The longest request id accepted, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

tokio::task_local! {
    static CONTEXT: RequestId;
}

/// A sanitized request id (cheap to clone).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// `raw` as a request id when it is 1..=[`MAX_REQUEST_ID_BYTES`] bytes
    /// of `[A-Za-z0-9._:/+=@-]`; `None` otherwise.
    pub fn sanitize(raw: &str) -> Option<Self> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_REQUEST_ID_BYTES
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/+=@-".contains(&b));
        ok.then(|| Self(Arc::from(raw)))
    }

    /// `raw` sanitized, else a generated id.
    pub fn accept(raw: Option<&str>) -> Self {
        raw.and_then(Self::sanitize).unwrap_or_else(Self::generate)
    }

    /// A new id: a per-process random prefix and a sequence number.
    pub fn generate() -> Self {
        static PREFIX: OnceLock<u64> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = *PREFIX.get_or_init(|| RandomState::new().hash_one(std::process::id()));
        let seq = NEXT.fetch_add(1, Ordering::Relaxed);
        // `{prefix:016x}-{seq:x}`, written without the formatter: every
        // call that enters without an id makes one (about a fifth of the
        // host's own per-call work went to `format!` here).
        let mut buf = [0_u8; 33];
        let mut at = hex(&mut buf, 0, prefix, 16);
        buf[at] = b'-';
        at += 1;
        let digits = (64 - seq.leading_zeros()).div_ceil(4).max(1) as usize;
        at = hex(&mut buf, at, seq, digits);
        // Only ASCII hex digits and '-' were written.
        Self(Arc::from(std::str::from_utf8(&buf[..at]).unwrap_or("0")))
    }

    /// The context id of the request this task is serving, if any.
    pub fn current() -> Option<Self> {
        CONTEXT.try_with(Clone::clone).ok()
    }

    /// The context id, else a generated one.
    pub(crate) fn current_or_new() -> Self {
        Self::current().unwrap_or_else(Self::generate)
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Runs `fut` with this id as its task's context id.
    pub(crate) fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        CONTEXT.scope(self, fut)
    }
}

/// Writes the `digits` lowest hex digits of `v` (lower case) into `buf`
/// at `at`; returns the index after them.
fn hex(buf: &mut [u8], at: usize, v: u64, digits: usize) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for i in 0..digits {
        let shift = 4 * (digits - 1 - i);
        buf[at + i] = DIGITS[((v >> shift) & 0xf) as usize];
    }
    at + digits
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({:?})", &*self.0)
    }
}

/// The context id an internal hop carries in `headers` (sanitized again:
/// else a new one).
pub(crate) fn hop_id(headers: &http::HeaderMap) -> RequestId {
    RequestId::accept(
        headers
            .get(super::names::CONTEXT_ID)
            .and_then(|v| v.to_str().ok()),
    )
}

/// The context id of a tenant request entering the router with `headers`:
/// inside an object (a nested call), the context id, whatever the tenant
/// supplied; at the edge, the tenant's id when it sanitizes, else a new
/// one. The tenant's [`REQUEST_ID_HEADER`] entries are removed from
/// `headers` either way (internal hops carry the context id only).
pub(crate) fn edge_id(headers: &mut Vec<(String, String)>) -> RequestId {
    let id = RequestId::current().unwrap_or_else(|| {
        RequestId::accept(
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(REQUEST_ID_HEADER))
                .map(|(_, v)| v.as_str()),
        )
    });
    strip_request_id(headers);
    id
}

/// Removes every [`REQUEST_ID_HEADER`] entry.
pub(crate) fn strip_request_id(headers: &mut Vec<(String, String)>) {
    headers.retain(|(k, _)| !k.eq_ignore_ascii_case(REQUEST_ID_HEADER));
}

#[cfg(test)]
mod tests;
