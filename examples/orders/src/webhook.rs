//! The outbox's sink: each batch of order events is `POST`ed as one JSON
//! array to a webhook URL; only a `2xx` acknowledges it. Anything else (a
//! refused connection, a timeout, another status) leaves the entries
//! pending and the outbox retries them: delivery is at least once, and a
//! receiver keeps the newest `version` per `key`.

use std::time::Duration;

use bytes::Bytes;
use durability_outbox::{Entry, Sink, SinkError};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use crate::api::OrderStatus;

/// What an order's outbox entry carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderEvent {
    /// The order id.
    pub order: String,
    /// Its new state.
    pub status: OrderStatus,
    /// The total.
    pub cents: i64,
    /// The payment, once paid.
    pub payment: Option<String>,
}

/// One element of a webhook body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The outbox key (the order id).
    pub key: String,
    /// The entry's version: newer supersedes older.
    pub version: u64,
    /// The event.
    pub event: OrderEvent,
}

/// A small HTTP/1.1 client (the webhook sink's, and the example test's).
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client whose requests time out (as a whole) after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout,
        }
    }

    /// Sends `method url` with `body` (JSON when not empty); the status and
    /// the body.
    ///
    /// # Errors
    /// The request could not be sent, failed or timed out (its outcome is
    /// then unknown).
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), String> {
        self.send_with(method, url, &[], body).await
    }

    /// [`HttpClient::send`] with extra headers.
    ///
    /// # Errors
    /// As [`HttpClient::send`].
    pub async fn send_with(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), String> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}

/// The sink `POST`ing order events to a webhook URL.
#[derive(Debug, Clone)]
pub struct WebhookSink {
    url: String,
    client: HttpClient,
}

impl WebhookSink {
    /// A sink posting to `url` (`http://…`), each attempt timing out after
    /// 5 s.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: HttpClient::new(Duration::from_secs(5)),
        }
    }
}

impl Sink<OrderEvent> for WebhookSink {
    async fn publish(&self, batch: &[Entry<OrderEvent>]) -> Result<(), SinkError> {
        let body: Vec<Delivery> = batch
            .iter()
            .map(|e| Delivery {
                key: e.key().to_owned(),
                version: e.version(),
                event: e.value().clone(),
            })
            .collect();
        let body = serde_json::to_vec(&body).map_err(|e| SinkError::new(e.to_string()))?;
        match self.client.send("POST", &self.url, body).await {
            Ok((status, _)) if (200..300).contains(&status) => Ok(()),
            Ok((status, _)) => Err(SinkError::new(format!("the webhook answered {status}"))),
            Err(e) => Err(SinkError::new(format!("the webhook failed: {e}"))),
        }
    }
}
