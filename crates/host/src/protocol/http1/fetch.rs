//! The fetch wire over HTTP/1.1: `POST /internal/do/fetch` on both sides,
//! framed as one line of JSON metadata, a newline and the body bytes (see
//! the transport module docs). The send path, the failure classifier and
//! the internal `POST` builder are the invoke's own.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{HttpTransport, internal_post};
use crate::fetch::FetchResponse;
use crate::protocol::{
    Endpoint, FETCH_PATH, FetchInvoke, InternalToken, MAX_FETCH_META_BYTES, MAX_FETCH_WIRE_BYTES,
    Reply,
};

pub(crate) const OCTET_STREAM: &str = "application/octet-stream";

/// One line of JSON metadata, a newline, the body.
pub(crate) fn encode_frame(meta: &Value, body: &[u8]) -> Bytes {
    // Compact JSON never holds a raw newline (strings escape it).
    let mut out = serde_json::to_vec(meta).unwrap_or_default();
    out.push(b'\n');
    out.extend_from_slice(body);
    Bytes::from(out)
}

/// Splits a frame into its metadata (parsed as `M`) and its body.
pub(crate) fn split_frame<M: serde::de::DeserializeOwned>(
    frame: &Bytes,
) -> Result<(M, Bytes), String> {
    let window = &frame[..frame.len().min(MAX_FETCH_META_BYTES + 1)];
    let Some(at) = window.iter().position(|b| *b == b'\n') else {
        return Err(format!(
            "no metadata line within {MAX_FETCH_META_BYTES} bytes"
        ));
    };
    let meta =
        std::str::from_utf8(&frame[..at]).map_err(|e| format!("the metadata is not UTF-8: {e}"))?;
    let meta: M =
        serde_json::from_str(meta).map_err(|e| format!("the metadata is malformed: {e}"))?;
    Ok((meta, frame.slice(at + 1..)))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireFetch {
    pub(crate) class: String,
    pub(crate) name: String,
    pub(crate) method: String,
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireFetchResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
}

/// The request frame of `invoke`.
pub(crate) fn request_frame(invoke: &FetchInvoke) -> Bytes {
    let r = &invoke.request;
    encode_frame(
        &json!({
            "class": invoke.class,
            "name": invoke.name,
            "method": r.method,
            "url": r.url,
            "headers": r.headers,
        }),
        &r.body,
    )
}

/// Reads the owner's success frame: status, headers and body, checked
/// against the response limits (a break is unreadable: the fetch may have
/// run).
pub(crate) fn parse_response(frame: Bytes) -> Result<FetchResponse, String> {
    let (meta, body): (WireFetchResponse, Bytes) = split_frame(&frame)?;
    FetchResponse {
        status: meta.status,
        headers: meta.headers,
        body,
    }
    .validate()
    .map_err(|e| format!("the fetch response breaks a limit: {e}"))
}

impl HttpTransport {
    pub(super) async fn send_fetch(
        &self,
        endpoint: &Endpoint,
        token: &InternalToken,
        invoke: &FetchInvoke,
    ) -> Reply<FetchResponse> {
        let http_request = match internal_post(
            endpoint,
            FETCH_PATH,
            token,
            invoke.fence.as_ref(),
            OCTET_STREAM,
            request_frame(invoke),
        ) {
            Ok(r) => r,
            Err(e) => {
                return Reply::NotSent {
                    reason: format!("building the request failed: {e}"),
                };
            }
        };
        self.round_trip(http_request, MAX_FETCH_WIRE_BYTES, parse_response)
            .await
    }
}
