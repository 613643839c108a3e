//! Connect requests under the fetch limits, and a session's messages over
//! an in-memory pair.

use bytes::Bytes;

use super::{ConnectRequest, MAX_MESSAGE_BYTES, Message, Socket};
use crate::fetch::{MAX_HEADER_BYTES, MAX_HEADERS, MAX_URL_BYTES};

#[test]
fn connect_requests_obey_the_fetch_limits_at_the_boundary_and_one_past() {
    let url = |len: usize| format!("/ws?{}", "q".repeat(len - 4));
    let ok = ConnectRequest::new(&url(MAX_URL_BYTES)).validate();
    assert_eq!(ok.expect("16 KiB").url.len(), MAX_URL_BYTES);
    let e = ConnectRequest::new(&url(MAX_URL_BYTES + 1))
        .validate()
        .expect_err("one past");
    assert_eq!(e.code(), "host_request_too_large");

    let mut many = ConnectRequest::new("/ws");
    many.headers = (0..MAX_HEADERS)
        .map(|i| (format!("h{i}"), "v".to_owned()))
        .collect();
    assert_eq!(
        many.clone().validate().expect("128").headers.len(),
        MAX_HEADERS
    );
    many.headers.push(("h-extra".to_owned(), "v".to_owned()));
    assert_eq!(
        many.validate().expect_err("129").code(),
        "host_request_too_large"
    );

    let big = |len: usize| ConnectRequest::new("/ws").header("h", &"v".repeat(len - 1));
    assert!(big(MAX_HEADER_BYTES).validate().is_ok());
    assert_eq!(
        big(MAX_HEADER_BYTES + 1)
            .validate()
            .expect_err("one past")
            .code(),
        "host_request_too_large"
    );
    for bad in [
        ConnectRequest::new("ws"),
        ConnectRequest::new("/ws").header("bad name", "v"),
        ConnectRequest::new("/ws").header("h", "a\tb"),
        ConnectRequest::new(&"n".repeat(129)).header(&"n".repeat(129), "v"),
    ] {
        assert_eq!(
            bad.clone().validate().expect_err("grammar").code(),
            "host_invalid_request",
            "{bad:?}"
        );
    }
    let stripped = ConnectRequest::new("/ws")
        .header("X-Tenant", "t")
        .header("X-Durability-Route-Task", "evil")
        .header("x-durability-internal-auth", "guess")
        .validate()
        .expect("valid");
    assert_eq!(
        stripped.headers,
        vec![("x-tenant".to_owned(), "t".to_owned())]
    );
}

#[tokio::test]
async fn a_pair_carries_text_and_binary_and_ends_on_close() {
    let (mut client, mut server) = Socket::pair().await;
    client
        .send(Message::Text("héllo".to_owned()))
        .await
        .expect("send");
    client
        .send(Message::Binary(Bytes::from_static(b"\x00\x01")))
        .await
        .expect("send");
    assert_eq!(
        server.recv().await.expect("open").expect("text"),
        Message::Text("héllo".to_owned())
    );
    assert_eq!(
        server.recv().await.expect("open").expect("binary"),
        Message::Binary(Bytes::from_static(b"\x00\x01"))
    );
    let over = client
        .send(Message::Binary(Bytes::from(vec![
            0u8;
            MAX_MESSAGE_BYTES + 1
        ])))
        .await
        .expect_err("over the cap");
    assert_eq!(over.code(), "host_transport_failed");
    let closing = tokio::spawn(async move { client.close().await });
    assert!(server.recv().await.is_none(), "the close ends the stream");
    drop(server);
    closing.await.expect("join").expect("closed");
}
