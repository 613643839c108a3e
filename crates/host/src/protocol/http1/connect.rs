//! The connect wire over HTTP/1.1: `GET /internal/do/connect` as a
//! WebSocket upgrade on both sides (hyper upgrades, framed by
//! tokio-tungstenite), with the tenant's request in one JSON header (see
//! the transport module docs). The send path, the failure classifier, the
//! token check and the fence reader are the invoke's own.

use std::convert::Infallible;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use durability_ownership::TaskId;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::{
    HttpTransport, SendFailure, classify_with, content_length, internal_request, owner_headers,
    read_capped,
};
use crate::connect::Socket;
use crate::protocol::{
    CONNECT_HINT_HEADER, CONNECT_HINT_STATUS, CONNECT_HINT_VALUE, CONNECT_META_HEADER,
    CONNECT_PATH, ConnectInvoke, ConnectReply, Endpoint, InternalToken, MAX_ENDPOINT_BYTES,
    OWNERSHIP_ERROR_HEADER, Reply,
};

/// The largest body of a connect refusal or handoff a caller reads.
pub(crate) const MAX_CONNECT_REFUSAL_BYTES: usize = 64 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireConnect {
    pub(crate) class: String,
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
}

/// The caller's reading of a connect answer that is not a `101`: a
/// response carrying the owner-hint marker is a [`ConnectReply::Hint`]
/// only with status [`CONNECT_HINT_STATUS`], the marker value
/// [`CONNECT_HINT_VALUE`], no ownership-error marker, the owner's task,
/// generation and endpoint, and scope key `key`; any break is
/// [`Reply::Unmarked`] with a fixed reason (no value of the response is
/// repeated). Without the marker it is classified as an invoke's refusal
/// (a `2xx` is unknown: a connect answers `101`).
pub(crate) fn classify_connect(
    status: u16,
    headers: &HeaderMap,
    body: Result<Bytes, String>,
    key: &str,
) -> ConnectReply {
    let unmarked = |reason: &str| {
        ConnectReply::Refused(Reply::Unmarked {
            reason: format!("a malformed owner hint: {reason}"),
        })
    };
    let Some(marker) = headers.get(CONNECT_HINT_HEADER) else {
        return ConnectReply::Refused(classify_with(
            status,
            headers,
            body,
            |_| -> Result<Infallible, String> {
                Err("a connect answers 101, not a success body".to_owned())
            },
        ));
    };
    if status != CONNECT_HINT_STATUS {
        return unmarked("the wrong status");
    }
    if marker.as_bytes() != CONNECT_HINT_VALUE.as_bytes() {
        return unmarked("the wrong marker value");
    }
    if headers.contains_key(OWNERSHIP_ERROR_HEADER) {
        return unmarked("an ownership-error marker too");
    }
    let Some(owner) = owner_headers(headers) else {
        return unmarked("incomplete owner metadata");
    };
    if TaskId::new(&owner.task).is_err() {
        return unmarked("a malformed owner task");
    }
    match &owner.endpoint {
        Some(e) if !e.is_empty() && e.len() <= MAX_ENDPOINT_BYTES => {}
        _ => return unmarked("no owner endpoint"),
    }
    if owner.key != key {
        return unmarked("another shard's key");
    }
    ConnectReply::Hint(owner)
}

/// The tenant's request as the one-line JSON of [`CONNECT_META_HEADER`].
pub(crate) fn meta_header(invoke: &ConnectInvoke) -> Result<HeaderValue, String> {
    let meta = serde_json::to_vec(&json!({
        "class": invoke.class,
        "name": invoke.name,
        "url": invoke.request.url,
        "headers": invoke.request.headers,
    }))
    .map_err(|e| format!("encoding the connect failed: {e}"))?;
    // Compact JSON escapes control characters; UTF-8 beyond ASCII is
    // carried as header bytes (obs-text).
    HeaderValue::from_bytes(&meta).map_err(|e| format!("the connect header is invalid: {e}"))
}

impl HttpTransport {
    pub(super) async fn send_connect(
        &self,
        endpoint: &Endpoint,
        token: &InternalToken,
        invoke: &ConnectInvoke,
        key: &str,
    ) -> ConnectReply {
        let not_sent = |reason: String| ConnectReply::Refused(Reply::NotSent { reason });
        let ws_key = generate_key();
        let meta = match meta_header(invoke) {
            Ok(m) => m,
            Err(reason) => return not_sent(reason),
        };
        let request = internal_request(
            http::Method::GET,
            endpoint,
            CONNECT_PATH,
            token,
            invoke.fence.as_ref(),
        )
        .header(http::header::CONNECTION, "upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_VERSION, "13")
        .header(http::header::SEC_WEBSOCKET_KEY, ws_key.as_str())
        .header(CONNECT_META_HEADER, meta)
        .body(Full::new(Bytes::new()));
        let request = match request {
            Ok(r) => r,
            Err(e) => return not_sent(format!("building the request failed: {e}")),
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut response = match self.request(request, deadline).await {
            Ok(r) => r,
            Err(SendFailure::NotSent(reason)) => return not_sent(reason),
            Err(SendFailure::AfterSending(reason)) => {
                return ConnectReply::Refused(Reply::Unmarked { reason });
            }
        };
        let status = response.status().as_u16();
        if status != 101 {
            let (parts, body) = response.into_parts();
            let read = tokio::time::timeout_at(
                deadline,
                read_capped(
                    body,
                    MAX_CONNECT_REFUSAL_BYTES,
                    content_length(&parts.headers),
                ),
            )
            .await
            .unwrap_or_else(|_| Err("the response body timed out".to_owned()));
            return classify_connect(status, &parts.headers, read, key);
        }
        let unmarked = |reason: &str| {
            ConnectReply::Refused(Reply::Unmarked {
                reason: reason.to_owned(),
            })
        };
        let headers = response.headers();
        if headers.contains_key(CONNECT_HINT_HEADER) || headers.contains_key(OWNERSHIP_ERROR_HEADER)
        {
            return unmarked("a 101 carrying a control marker");
        }
        let accept = headers
            .get(http::header::SEC_WEBSOCKET_ACCEPT)
            .map(HeaderValue::as_bytes);
        if accept != Some(derive_accept_key(ws_key.as_bytes()).as_bytes()) {
            return unmarked("a 101 without the matching WebSocket accept key");
        }
        let owner = owner_headers(headers);
        let upgraded = tokio::time::timeout_at(deadline, hyper::upgrade::on(&mut response)).await;
        match upgraded {
            Ok(Ok(io)) => ConnectReply::Upgraded {
                socket: Socket::over(Box::new(TokioIo::new(io)), Role::Client).await,
                owner,
            },
            Ok(Err(e)) => unmarked(&format!("the upgrade failed: {e}")),
            Err(_) => unmarked("the upgrade timed out"),
        }
    }
}
