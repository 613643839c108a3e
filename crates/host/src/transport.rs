//! Calls between hosts: the wire (paths, control headers, envelopes), the
//! [`Transport`] trait a caller sends invokes through, and the HTTP/1.1
//! implementation ([`HttpTransport`] and [`crate::wire::serve`]).
//!
//! This module (its server side in [`crate::wire`]) is the only network
//! code of the host. What it carries:
//!
//! - `POST /internal/do/invoke`: `{ class, name, method, args }`, with the
//!   shared internal token in [`AUTH_HEADER`] and, on a forwarded or
//!   cached-direct call, the route fence in [`ROUTE_TASK_HEADER`] /
//!   [`ROUTE_GENERATION_HEADER`]. A fenced invoke is never forwarded again:
//!   the receiver runs it or answers a trusted stale-owner error.
//! - Success: `200 { "ok": true, "result": … }` with the owner's trusted
//!   headers ([`OWNER_TASK_HEADER`], [`OWNER_GENERATION_HEADER`],
//!   [`OWNER_KEY_HEADER`], [`OWNER_ENDPOINT_HEADER`]).
//! - Failure: `{ error, message, details? }`; a pre-dispatch ownership
//!   refusal is a `503` whose [`OWNERSHIP_ERROR_HEADER`] marker repeats the
//!   code.
//! - `POST /internal/do/alarm`: an alarm delivery for an object this host
//!   owns, claimed by another host's dispatcher: `{ object, token,
//!   scheduledAt, attempt, finalAttempt }` with the token and the route
//!   fence (always). The receiver admits it only at the fence's task and
//!   generation and answers `200` with one of the dispatch response
//!   variants of `durability_alarms` (`encode_dispatch_outcome`), read
//!   back under their 16 KiB cap and 5 s body deadline.
//! - `POST /internal/do/fetch`: a tenant fetch ([`crate::fetch`]) with the
//!   token and, on a forwarded or cached-direct fetch, the route fence.
//!   The body is one line of JSON metadata, `{ class, name, method, url,
//!   headers: [[name, value], …] }`, a newline, then the tenant's body
//!   bytes (at most [`MAX_FETCH_WIRE_BYTES`] in all). The owner answers
//!   `200` with its trusted headers and a body framed the same way: `{
//!   status, headers }`, a newline, the tenant's response body. The
//!   tenant's own status (a 503 included) is inside that frame, so it is
//!   never taken for a transport status. Refusals are error envelopes, as
//!   for invokes.
//! - `GET /internal/do/connect`: a WebSocket upgrade ([`crate::connect`])
//!   with the token, on a cached-direct or handed-off connect the route
//!   fence, and the tenant's request as one line of JSON in
//!   [`CONNECT_META_HEADER`] (`{ class, name, url, headers }`, checked
//!   against the fetch limits before dispatch). Only the owner answers
//!   `101`, after admission at the fence's generation, with its trusted
//!   owner headers. A host that does not own the scope never upgrades: it
//!   answers a hint-only handoff, a `503` whose [`CONNECT_HINT_HEADER`]
//!   marker is [`CONNECT_HINT_VALUE`], with the owner's task, generation,
//!   scope key and endpoint in the owner headers (or a trusted
//!   `stale_owner` when it knows no other owner). Refusals are error
//!   envelopes, as for invokes.
//! - `GET /health` (liveness), `GET /ready` (readiness: `503` from the
//!   drain's start) and `GET /metrics` are the only unauthenticated paths;
//!   `GET /internal/do/probe` needs the token.

pub use crate::protocol::*;
pub use crate::wire::serve;
