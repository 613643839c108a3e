//! `GET /internal/do/connect`: the owner's side of a WebSocket connect.

use super::*;
use crate::bounds::{HostAlarms, HostLeases};
use crate::connect::{ConnectRequest, Socket};
use crate::host::Host;
use crate::protocol::http1::connect::*;
use crate::protocol::{
    CONNECT_HINT_HEADER, CONNECT_HINT_STATUS, CONNECT_HINT_VALUE, CONNECT_META_HEADER,
    ConnectInvoke, MAX_FETCH_META_BYTES, OwnerHeaders,
};
use crate::routing::{Served, Session};
use crate::store::ObjectStore;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::sync::Arc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Whether header `name` lists `token` (comma-separated, any case).
pub(crate) fn lists(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// The hint-only handoff: the trusted control status, the marker and the
/// owner's headers; nothing is upgraded.
pub(crate) fn handoff_response(owner: &OwnerHeaders) -> Response {
    let mut response = (
        StatusCode::from_u16(CONNECT_HINT_STATUS).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
        axum::Json(json!({ "error": "owner_hint", "message": "Connect to the owner" })),
    )
        .into_response();
    let h = response.headers_mut();
    h.insert(
        CONNECT_HINT_HEADER,
        HeaderValue::from_static(CONNECT_HINT_VALUE),
    );
    put_owner_headers(h, owner);
    response
}

/// `GET /internal/do/connect`: token, fence, the upgrade headers, the
/// tenant's request under the fetch limits, then [`Host::serve_connect`];
/// `101` only when this host admitted the session as the owner.
pub(crate) async fn connect_endpoint<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    request: Request,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    let headers = &parts.headers;
    if let Some(refused) = refused(&host, headers) {
        host.count_refused_auth();
        return refused;
    }
    let fence = match fence_of(headers) {
        Ok(f) => f,
        Err(reason) => return error_response(400, "invalid_fence", reason, false),
    };
    let checked = upgrade_key(headers).and_then(|key| Ok((key, connect_meta(headers)?)));
    let (ws_key, wire) = match checked {
        Ok(checked) => checked,
        Err((status, code, message)) => return error_response(status, code, &message, false),
    };
    let checked = ConnectRequest {
        url: wire.url,
        headers: wire.headers,
    }
    .validate();
    let mut request = match checked {
        Ok(request) => request,
        Err(e) => return host_error_response(&e, true),
    };
    // An internal hop carries the context id, never a tenant's.
    strip_request_id(&mut request.headers);
    let served = hop_id(headers)
        .scope(host.serve_connect(ConnectInvoke {
            class: wire.class,
            name: wire.name,
            request,
            fence,
        }))
        .await;
    let session = match served {
        Ok(Served::Upgrade(session)) => session,
        Ok(Served::Hint(owner)) => return handoff_response(&owner),
        Err(e) => return host_error_response(&e, true),
    };
    let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
        return error_response(
            400,
            "invalid_request",
            "the connection cannot be upgraded",
            false,
        );
    };
    upgraded(&ws_key, session, on_upgrade)
}

/// A connect refused before the host is asked: status, code, message.
type BadConnect = (u16, &'static str, String);

/// The caller's WebSocket key, when the request is a WebSocket upgrade.
fn upgrade_key(headers: &HeaderMap) -> Result<Vec<u8>, BadConnect> {
    let ws_key = headers
        .get(http::header::SEC_WEBSOCKET_KEY)
        .filter(|k| !k.is_empty())
        .map(|k| k.as_bytes().to_vec());
    let upgrade = lists(headers, http::header::UPGRADE, "websocket")
        && lists(headers, http::header::CONNECTION, "upgrade")
        && headers
            .get(http::header::SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v.as_bytes() == b"13");
    match (ws_key, upgrade) {
        (Some(ws_key), true) => Ok(ws_key),
        _ => Err((
            400,
            "invalid_request",
            "the connect is not a WebSocket upgrade".to_owned(),
        )),
    }
}

/// The connect's object and tenant request, from its metadata header
/// (under the fetch metadata cap).
fn connect_meta(headers: &HeaderMap) -> Result<WireConnect, BadConnect> {
    let Some(meta) = headers.get(CONNECT_META_HEADER) else {
        return Err((
            400,
            "invalid_request",
            "the connect names no object".to_owned(),
        ));
    };
    if meta.len() > MAX_FETCH_META_BYTES {
        return Err((
            413,
            "request_too_large",
            format!("the connect metadata is over {MAX_FETCH_META_BYTES} bytes"),
        ));
    }
    serde_json::from_slice(meta.as_bytes()).map_err(|e| {
        (
            400,
            "invalid_request",
            format!("the connect is not {{ class, name, url, headers }}: {e}"),
        )
    })
}

/// The `101` with the owner's headers; the admitted session runs on the
/// upgraded connection.
fn upgraded<I, D>(
    ws_key: &[u8],
    session: Session<I, D>,
    on_upgrade: hyper::upgrade::OnUpgrade,
) -> Response
where
    I: Send + Sync + 'static,
    D: Send + Sync + 'static,
{
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("upgrade"),
    );
    h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(ws_key)) {
        h.insert(http::header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    put_owner_headers(h, &session.owner);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => {
                let socket = Socket::over(Box::new(TokioIo::new(io)), Role::Server).await;
                session.run(socket).await;
            }
            Err(e) => tracing::warn!(
                event = "durability.host.connect_upgrade_failed",
                scope = session.owner.key,
                error = %e,
                "the caller went away before the upgrade completed; the session is dropped"
            ),
        }
    });
    response
}
