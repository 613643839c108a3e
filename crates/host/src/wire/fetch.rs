//! `POST /internal/do/fetch`: the owner's side of a tenant fetch.

use super::*;
use crate::bounds::{HostAlarms, HostLeases};
use crate::fetch::FetchRequest;
use crate::host::Host;
use crate::protocol::http1::fetch::*;
use crate::protocol::{FetchInvoke, MAX_FETCH_WIRE_BYTES};
use crate::store::ObjectStore;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;

/// `POST /internal/do/fetch`: token, fence, the frame under its cap (an
/// oversized Content-Length refused before reading), the limits, then
/// [`Host::serve_fetch`].
pub(crate) async fn fetch_endpoint<S: HostLeases, I: HostAlarms, O: ObjectStore>(
    State(host): State<Arc<Host<S, I, O>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (fence, frame) = match admitted_body(&host, &headers, body, MAX_FETCH_WIRE_BYTES).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let (meta, body): (WireFetch, Bytes) = match split_frame(&frame) {
        Ok(parts) => parts,
        Err(reason) => {
            return error_response(
                400,
                "invalid_request",
                &format!(
                    "the fetch is not {{ class, name, method, url, headers }} + body: {reason}"
                ),
                false,
            );
        }
    };
    let request = FetchRequest {
        method: meta.method,
        url: meta.url,
        headers: meta.headers,
        body,
    }
    .validate();
    let mut request = match request {
        Ok(request) => request,
        Err(e) => return host_error_response(&e, true),
    };
    // An internal hop carries the context id, never a tenant's.
    strip_request_id(&mut request.headers);
    let served = hop_id(&headers)
        .scope(host.serve_fetch(FetchInvoke {
            class: meta.class,
            name: meta.name,
            request,
            fence,
        }))
        .await;
    match served {
        Ok((response, owner)) => {
            let frame = encode_frame(
                &json!({ "status": response.status, "headers": response.headers }),
                &response.body,
            );
            let mut out = Response::new(Body::from(frame));
            out.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(OCTET_STREAM),
            );
            put_owner_headers(out.headers_mut(), &owner);
            out
        }
        Err(e) => host_error_response(&e, true),
    }
}
