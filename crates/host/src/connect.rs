//! WebSocket connect on objects: an object class registers one connect
//! handler ([`crate::HostConfig::connect`]) and `host.object_by_name(class, name)
//! .connect(request)` opens a WebSocket session with it on the host that
//! owns the object's scope (see [`crate::ObjectRef::connect`] for the
//! routing rules).
//!
//! - The handler gets the object's [`crate::Handle`], the validated
//!   [`ConnectRequest`] (control headers stripped) and the server end of
//!   the session as a [`Socket`] of text and binary [`Message`]s; the
//!   caller gets the client end. Pings are answered by the socket itself.
//! - A [`ConnectRequest`] is checked before dispatch with the fetch path's
//!   rules and typed errors (see [`crate::fetch`]): the URL is at most
//!   [`crate::fetch::MAX_URL_BYTES`], at most
//!   [`crate::fetch::MAX_HEADERS`] header entries and
//!   [`crate::fetch::MAX_HEADER_BYTES`] of names and values combined, each
//!   name at most [`crate::fetch::MAX_HEADER_NAME_BYTES`] of token syntax,
//!   no control characters in values; headers under the control prefix are
//!   stripped.
//! - A message is at most [`MAX_MESSAGE_BYTES`] (a larger one fails the
//!   socket that receives it).
//! - The session is admitted once, before the upgrade, like a call
//!   (running host, owner at the route fence's generation, admission); its
//!   messages are not re-fenced one by one. The object counts as busy while
//!   the session runs (idle eviction skips it), but the session is not
//!   admitted work: a drain does not wait for it. It ends (the handler's
//!   future is dropped and the connection closed) when the handler
//!   returns, when the object's scope is lost here, or when the host starts
//!   draining. What the handler commits goes through the object's storage
//!   fence, so a write after the scope moved is refused.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::error::{BoxError, HostError};
use crate::fetch::FetchRequest;
use crate::object::{Handle, MethodInput};

/// The largest WebSocket message (and frame) either end accepts: 1 MiB.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// A tenant's WebSocket connect request: the URL and headers the object's
/// handler sees (the upgrade itself is the host's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The complete URL.
    pub url: String,
    /// The header entries, in order (repeated names allowed).
    pub headers: Vec<(String, String)>,
}

impl ConnectRequest {
    /// A request with no headers.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            headers: Vec::new(),
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
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Checks the request against the fetch path's URL and header limits
    /// (the same checks, as a `GET` without a body), lowercases the header
    /// names and strips the host's control headers.
    ///
    /// # Errors
    /// [`HostError::InvalidRequest`] for a grammar break (URL form, header
    /// name or value), [`HostError::RequestTooLarge`] for a size break (URL,
    /// header count or bytes).
    pub fn validate(self) -> Result<Self, HostError> {
        let mut as_fetch = FetchRequest::new("GET", "");
        as_fetch.url = self.url;
        as_fetch.headers = self.headers;
        let checked = as_fetch.validate()?;
        Ok(Self {
            url: checked.url,
            headers: checked.headers,
        })
    }
}

/// One WebSocket message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message.
    Text(String),
    /// A binary message.
    Binary(Bytes),
}

/// A connect handler of the objects of class `T`: it gets the object's
/// [`Handle`], the validated [`ConnectRequest`] and the
/// server end of the session ([`Socket`]), and runs the
/// session. Implemented for every such function or closure.
pub trait SessionHandler<T, I, D>:
    Fn(Handle<T, I, D>, ConnectRequest, Socket) -> Self::Future + Send + Sync + 'static
{
    /// What it returns.
    type Future: Future<Output = Result<(), BoxError>> + Send + 'static;
}

impl<T, I, D, F, Fut> SessionHandler<T, I, D> for F
where
    F: Fn(Handle<T, I, D>, ConnectRequest, Socket) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    type Future = Fut;
}

/// The byte stream a [`Socket`] runs over (a hyper upgrade, or an
/// in-memory pipe for a session with an object owned by the caller's own
/// host).
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// One end of a WebSocket session.
pub struct Socket {
    inner: Box<WebSocketStream<Box<dyn Io>>>,
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket").finish_non_exhaustive()
    }
}

fn socket_failed(e: &tokio_tungstenite::tungstenite::Error) -> HostError {
    HostError::Transport {
        reason: format!("the WebSocket failed: {e}"),
    }
}

impl Socket {
    /// Frames `io` as a WebSocket end of `role` (no handshake: it already
    /// happened, or there is none for an in-memory pipe).
    pub(crate) async fn over(io: Box<dyn Io>, role: Role) -> Self {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        Self {
            inner: Box::new(WebSocketStream::from_raw_socket(io, role, Some(config)).await),
        }
    }

    /// A connected pair over an in-memory pipe: (client end, server end).
    pub(crate) async fn pair() -> (Self, Self) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        (
            Self::over(Box::new(client), Role::Client).await,
            Self::over(Box::new(server), Role::Server).await,
        )
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`HostError::Transport`] when the session is closed or broken, or
    /// the message is larger than [`MAX_MESSAGE_BYTES`].
    pub async fn send(&mut self, message: Message) -> Result<(), HostError> {
        let len = match &message {
            Message::Text(t) => t.len(),
            Message::Binary(b) => b.len(),
        };
        if len > MAX_MESSAGE_BYTES {
            return Err(HostError::Transport {
                reason: format!(
                    "a message of {len} bytes is over the {MAX_MESSAGE_BYTES}-byte cap"
                ),
            });
        }
        let frame = match message {
            Message::Text(t) => WsMessage::text(t),
            Message::Binary(b) => WsMessage::binary(b),
        };
        self.inner.send(frame).await.map_err(|e| socket_failed(&e))
    }

    /// The next text or binary message; `None` once the peer closed the
    /// session (pings and pongs are handled here and not returned).
    ///
    /// # Errors
    /// [`HostError::Transport`] when the session broke (a protocol error,
    /// a message over the cap, the connection lost without a close).
    pub async fn recv(&mut self) -> Option<Result<Message, HostError>> {
        loop {
            match self.inner.next().await? {
                Ok(WsMessage::Text(t)) => return Some(Ok(Message::Text(t.as_str().to_owned()))),
                Ok(WsMessage::Binary(b)) => return Some(Ok(Message::Binary(b))),
                Ok(WsMessage::Close(_)) => return None,
                Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_)) => {}
                Err(e) => return Some(Err(socket_failed(&e))),
            }
        }
    }

    /// Closes the session (a normal close frame, then the connection).
    ///
    /// # Errors
    /// [`HostError::Transport`] when the close could not be sent.
    pub async fn close(mut self) -> Result<(), HostError> {
        match WebSocketStream::close(&mut self.inner, None).await {
            Ok(())
            | Err(
                tokio_tungstenite::tungstenite::Error::ConnectionClosed
                | tokio_tungstenite::tungstenite::Error::AlreadyClosed,
            ) => Ok(()),
            Err(e) => Err(socket_failed(&e)),
        }
    }
}

/// A registered connect handler.
pub(crate) type Connector<I, D> = Arc<
    dyn Fn(MethodInput<I, D>, ConnectRequest, Socket) -> BoxFuture<'static, Result<(), BoxError>>
        + Send
        + Sync,
>;

/// The connect handler of every class that has one: class → handler.
pub(crate) type Connectors<I, D> = BTreeMap<String, Connector<I, D>>;

#[cfg(test)]
mod tests;
