//! Tenant fetch on objects: an object class registers one fetch handler
//! ([`crate::HostConfig::fetch`]) and `host.object_by_name(class, name)
//! .fetch(request)` runs it once on the host that owns the object's scope,
//! under the same routing as RPC (forwarded once, owner hint, fence) and
//! the fetch replay rules (see [`crate::ObjectRef::fetch`]).
//!
//! A [`FetchRequest`] is checked before dispatch ([`FetchRequest::validate`]),
//! on the caller and again on the owner:
//!
//! - the method is an HTTP token (RFC 9110 `tchar`s), 1..=[`MAX_METHOD_BYTES`]
//!   bytes;
//! - the complete URL is 1..=[`MAX_URL_BYTES`] bytes of UTF-8, an origin-form
//!   path (`/…`) or an absolute `http://` / `https://` URL, without control
//!   characters or spaces;
//! - at most [`MAX_HEADERS`] header entries and [`MAX_HEADER_BYTES`] of
//!   names and values combined; each name 1..=[`MAX_HEADER_NAME_BYTES`]
//!   bytes of token syntax (lowercased), each value without control
//!   characters (`char::is_control`: tab included);
//! - a body of at most [`MAX_BODY_BYTES`].
//!
//! Grammar breaks are [`HostError::InvalidRequest`] (`invalid_request`),
//! size breaks [`HostError::RequestTooLarge`] (`request_too_large`). After
//! the checks (which count every header the tenant supplied), headers under
//! the host's control prefix ([`crate::transport::CONTROL_HEADER_PREFIX`],
//! `x-durability-`: the token, route fence, owner and ownership-error
//! markers) are stripped, so a handler never sees a forged control header.
//!
//! A handler's [`FetchResponse`] is checked the same way (status
//! 200..=599, the header and body limits; control headers stripped); a
//! response that breaks them is the handler's failure (`internal_error`
//! across hosts). A handler's error is handled like an RPC method's: a
//! [`crate::MethodError`] keeps its code and message, anything else is
//! `internal_error`.
//!
//! These are logical limits on what the tenant sends, not wire
//! guarantees: the internal hop adds its own framing and headers, and a
//! proxy in between may impose smaller limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::error::{BoxError, HostError};
use crate::object::MethodInput;

/// Every control header prefix: a request's or response's headers under it
/// that the host did not set itself are stripped.
pub const CONTROL_HEADER_PREFIX: &str = "x-durability-";

/// The longest method, in bytes.
pub const MAX_METHOD_BYTES: usize = 64;
/// The longest complete URL, in UTF-8 bytes: 16 KiB.
pub const MAX_URL_BYTES: usize = 16 * 1024;
/// The most header entries.
pub const MAX_HEADERS: usize = 128;
/// The most bytes of header names and values combined: 128 KiB.
pub const MAX_HEADER_BYTES: usize = 128 * 1024;
/// The longest header name, in bytes.
pub const MAX_HEADER_NAME_BYTES: usize = 128;
/// The largest request (and response) body: 1 MiB.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// A tenant fetch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// The method (`GET`, `POST`, ...): an HTTP token, case-sensitive.
    pub method: String,
    /// The complete URL.
    pub url: String,
    /// The header entries, in order (repeated names allowed).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl FetchRequest {
    /// A request with no headers and no body.
    pub fn new(method: &str, url: &str) -> Self {
        Self {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Adds a header entry.
    #[must_use]
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        header_value(&self.headers, name)
    }

    /// Whether the method is safe to replay (`GET` or `HEAD`).
    pub fn is_safe(&self) -> bool {
        matches!(self.method.as_str(), "GET" | "HEAD")
    }

    /// Checks the request against the limits (module docs), lowercases the
    /// header names and strips the host's control headers.
    ///
    /// # Errors
    /// [`HostError::InvalidRequest`] for a grammar break (method, URL form,
    /// header name or value), [`HostError::RequestTooLarge`] for a size
    /// break (URL, header count or bytes, body).
    pub fn validate(mut self) -> Result<Self, HostError> {
        let invalid = |reason: String| HostError::InvalidRequest { reason };
        if self.method.is_empty() || !self.method.bytes().all(is_tchar) {
            return Err(invalid("the method is not an HTTP token".to_owned()));
        }
        if self.method.len() > MAX_METHOD_BYTES {
            return Err(invalid(format!(
                "the method is longer than {MAX_METHOD_BYTES} bytes"
            )));
        }
        if self.url.len() > MAX_URL_BYTES {
            return Err(HostError::RequestTooLarge {
                reason: format!(
                    "the URL is {} bytes, more than {MAX_URL_BYTES}",
                    self.url.len()
                ),
            });
        }
        let form_ok = self.url.starts_with('/')
            || self.url.starts_with("http://")
            || self.url.starts_with("https://");
        if !form_ok {
            return Err(invalid(
                "the URL is neither a path (`/…`) nor an absolute http(s) URL".to_owned(),
            ));
        }
        if self
            .url
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(invalid(
                "the URL holds a control character or whitespace".to_owned(),
            ));
        }
        check_headers_and_body(&mut self.headers, &self.body, "the body")?;
        Ok(self)
    }
}

/// What a fetch handler answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResponse {
    /// The status (200..=599).
    pub status: u16,
    /// The header entries, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl FetchResponse {
    /// A response with `status`, no headers and `body`.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header entry.
    #[must_use]
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        header_value(&self.headers, name)
    }

    /// Checks the response against the limits (status 200..=599, the
    /// header and body limits), lowercases the header names and strips
    /// control headers.
    ///
    /// # Errors
    /// [`HostError::InvalidRequest`] or [`HostError::RequestTooLarge`]
    /// naming the break (a handler's break is reported as its failure).
    pub fn validate(mut self) -> Result<Self, HostError> {
        if !(200..=599).contains(&self.status) {
            return Err(HostError::InvalidRequest {
                reason: format!("the response status {} is not 200..=599", self.status),
            });
        }
        check_headers_and_body(&mut self.headers, &self.body, "the response body")?;
        Ok(self)
    }
}

fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `name` (any case) is one of the host's control headers.
pub(crate) fn is_control_header(name: &str) -> bool {
    name.len() >= CONTROL_HEADER_PREFIX.len()
        && name.as_bytes()[..CONTROL_HEADER_PREFIX.len()]
            .eq_ignore_ascii_case(CONTROL_HEADER_PREFIX.as_bytes())
}

/// Checks header entries ([`check_headers`]) and then the body's size
/// (`body_name` names it in the error).
fn check_headers_and_body(
    headers: &mut Vec<(String, String)>,
    body: &Bytes,
    body_name: &str,
) -> Result<(), HostError> {
    check_headers(headers)?;
    if body.len() > MAX_BODY_BYTES {
        return Err(HostError::RequestTooLarge {
            reason: format!(
                "{body_name} is {} bytes, more than {MAX_BODY_BYTES}",
                body.len()
            ),
        });
    }
    Ok(())
}

/// Checks header entries (count, combined bytes, name grammar, values),
/// lowercases the names and strips control headers.
fn check_headers(headers: &mut Vec<(String, String)>) -> Result<(), HostError> {
    let invalid = |reason: String| HostError::InvalidRequest { reason };
    if headers.len() > MAX_HEADERS {
        return Err(HostError::RequestTooLarge {
            reason: format!("{} header entries, more than {MAX_HEADERS}", headers.len()),
        });
    }
    let total: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_HEADER_BYTES {
        return Err(HostError::RequestTooLarge {
            reason: format!(
                "header names and values are {total} bytes, more than {MAX_HEADER_BYTES}"
            ),
        });
    }
    for (name, value) in headers.iter_mut() {
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(invalid("a header name is not an HTTP token".to_owned()));
        }
        if name.len() > MAX_HEADER_NAME_BYTES {
            return Err(invalid(format!(
                "a header name is longer than {MAX_HEADER_NAME_BYTES} bytes"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(format!(
                "the value of header {name} holds a control character"
            )));
        }
        name.make_ascii_lowercase();
    }
    headers.retain(|(name, _)| !is_control_header(name));
    Ok(())
}

/// A registered fetch handler.
pub(crate) type Fetcher<I, D> = Arc<
    dyn Fn(MethodInput<I, D>, FetchRequest) -> BoxFuture<'static, Result<FetchResponse, BoxError>>
        + Send
        + Sync,
>;

/// The fetch handler of every class that has one: class → handler.
pub(crate) type Fetchers<I, D> = BTreeMap<String, Fetcher<I, D>>;

#[cfg(test)]
mod tests;
