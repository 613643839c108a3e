//! The dispatch response wire contract for a [`crate::Dispatch`] that talks
//! to a remote host: strict UTF-8 JSON variants, a 16 KiB cap and an
//! independent 5 s body deadline. Anything that cannot be read and
//! classified is an unknown outcome (the claim is kept until its lease
//! expires), never a success. [`encode_dispatch_outcome`] is the serving
//! side: every [`DispatchOutcome`] maps to exactly one variant, and
//! [`decode_dispatch_response`] reads it back to the outcome the sender
//! acts on.

use std::pin::pin;

use durability_time::Clock;
use durability_time::timeout_at;
use futures::{Stream, StreamExt};
use serde::Deserialize;

use crate::dispatcher::DispatchOutcome;
use crate::error::{AlarmError, BoxError};
use crate::policy::{MAX_RESPONSE_BYTES, RESPONSE_DEADLINE_MS};

/// The code a host sends when the alarm provably settled as a failure
/// (`"started":true`) or provably never started (`"started":false`).
pub const DISPATCH_FAILED: &str = "do_alarm_dispatch_failed";
/// The code a host sends when the alarm's outcome is unknown.
pub const DISPATCH_RESULT_UNKNOWN: &str = "do_alarm_dispatch_result_unknown";
/// The code a host sends when the object's alarm row is not due yet (with
/// its time in `at`): nothing ran; the job is rescheduled for `at`.
pub const DISPATCH_NOT_DUE: &str = "do_alarm_not_due";
/// The code a host sends when the object's storage is inactive or being
/// deleted: nothing ran; the job discards itself.
pub const DISPATCH_STORAGE_GONE: &str = "do_alarm_storage_gone";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    ok: bool,
    #[serde(default)]
    ignored: Option<bool>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    started: Option<bool>,
    #[serde(default)]
    at: Option<i64>,
}

/// Decodes one complete response body.
///
/// Accepted: `{"ok":true}`, `{"ok":true,"ignored":bool}`,
/// `{"ok":false,"error":"do_alarm_dispatch_failed","started":bool}`,
/// `{"ok":false,"error":"do_alarm_dispatch_result_unknown"}`, and two
/// variants that only hosts of this crate send:
/// `{"ok":false,"error":"do_alarm_not_due","at":<ms>}` (a safe integer) and
/// `{"ok":false,"error":"do_alarm_storage_gone"}`.
///
/// # Errors
/// [`AlarmError::ResponseTooLarge`] above 16 KiB; [`AlarmError::Corrupt`]
/// for anything else that is not exactly one of the variants.
pub fn decode_dispatch_response(body: &[u8]) -> Result<DispatchOutcome, AlarmError> {
    if body.len() > MAX_RESPONSE_BYTES {
        return Err(AlarmError::ResponseTooLarge {
            limit: MAX_RESPONSE_BYTES,
        });
    }
    let bad = |reason: &str| AlarmError::Corrupt {
        reason: format!("dispatch response: {reason}"),
    };
    let text = std::str::from_utf8(body).map_err(|_| bad("not UTF-8"))?;
    let raw: Raw = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    match (
        raw.ok,
        raw.ignored,
        raw.error.as_deref(),
        raw.started,
        raw.at,
    ) {
        (true, None | Some(false), None, None, None) => Ok(DispatchOutcome::Delivered),
        (true, Some(true), None, None, None) => Ok(DispatchOutcome::Ignored),
        (false, None, Some(DISPATCH_FAILED), Some(false), None) => {
            Ok(DispatchOutcome::NeverStarted {
                reason: DISPATCH_FAILED.to_owned(),
            })
        }
        (false, None, Some(DISPATCH_FAILED), Some(true), None) => Ok(DispatchOutcome::Failed {
            reason: DISPATCH_FAILED.to_owned(),
        }),
        (false, None, Some(DISPATCH_RESULT_UNKNOWN), None, None) => Ok(DispatchOutcome::Unknown {
            reason: DISPATCH_RESULT_UNKNOWN.to_owned(),
        }),
        (false, None, Some(DISPATCH_NOT_DUE), None, Some(at)) => {
            let at =
                crate::token::validate_time(at).map_err(|_| bad("`at` is not a valid time"))?;
            Ok(DispatchOutcome::NotDue { at })
        }
        (false, None, Some(DISPATCH_STORAGE_GONE), None, None) => Ok(DispatchOutcome::Gone),
        _ => Err(bad("not one of the accepted variants")),
    }
}

/// The response body a serving host sends for `outcome` (one of the
/// variants [`decode_dispatch_response`] accepts). Both never-started
/// outcomes are `do_alarm_dispatch_failed` with `"started":false`: the
/// serving host is not the one to wait for an owner, the sender decides.
/// Reasons stay on the serving host (in its logs), never on the wire.
pub fn encode_dispatch_outcome(outcome: &DispatchOutcome) -> String {
    match outcome {
        DispatchOutcome::Delivered => r#"{"ok":true}"#.to_owned(),
        DispatchOutcome::Ignored => r#"{"ok":true,"ignored":true}"#.to_owned(),
        DispatchOutcome::NeverStarted { .. } | DispatchOutcome::OwnerElsewhere { .. } => {
            format!(r#"{{"ok":false,"error":"{DISPATCH_FAILED}","started":false}}"#)
        }
        DispatchOutcome::Failed { .. } => {
            format!(r#"{{"ok":false,"error":"{DISPATCH_FAILED}","started":true}}"#)
        }
        DispatchOutcome::Unknown { .. } => {
            format!(r#"{{"ok":false,"error":"{DISPATCH_RESULT_UNKNOWN}"}}"#)
        }
        DispatchOutcome::NotDue { at } => {
            format!(r#"{{"ok":false,"error":"{DISPATCH_NOT_DUE}","at":{at}}}"#)
        }
        DispatchOutcome::Gone => format!(r#"{{"ok":false,"error":"{DISPATCH_STORAGE_GONE}"}}"#),
    }
}

/// Reads a response body of chunks under the 16 KiB cap (an oversized
/// declared length is refused before reading) and the 5 s deadline on
/// `clock`, then decodes it. Every failure is
/// [`DispatchOutcome::Unknown`], with the error code as its reason.
pub async fn read_dispatch_response<B>(
    clock: &dyn Clock,
    content_length: Option<u64>,
    body: B,
) -> DispatchOutcome
where
    B: Stream<Item = Result<Vec<u8>, BoxError>>,
{
    let unknown = |e: AlarmError| {
        tracing::warn!(
            event = "durability.alarms.dispatch_response_unreadable",
            code = e.code(),
            error = %e,
            "dispatch response unreadable; result unknown"
        );
        DispatchOutcome::Unknown {
            reason: e.code().to_owned(),
        }
    };
    if content_length.is_some_and(|n| n > MAX_RESPONSE_BYTES as u64) {
        return unknown(AlarmError::ResponseTooLarge {
            limit: MAX_RESPONSE_BYTES,
        });
    }
    let deadline = clock.now_ms().saturating_add(RESPONSE_DEADLINE_MS);
    let read = async {
        let mut body = pin!(body);
        let mut buf = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(AlarmError::unknown)?;
            if buf.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(AlarmError::ResponseTooLarge {
                    limit: MAX_RESPONSE_BYTES,
                });
            }
            buf.extend_from_slice(&chunk);
        }
        decode_dispatch_response(&buf)
    };
    match timeout_at(clock, deadline, read).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => unknown(e),
        Err(_) => unknown(AlarmError::unknown(
            "dispatch response deadline (5 s) passed",
        )),
    }
}
