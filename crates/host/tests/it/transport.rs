//! The HTTP client's response cap against a raw server on loopback: an
//! announced oversize is refused before reading, a chunked stream is cut
//! as it crosses the cap, and exactly the cap is read.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::time::Duration;

use durability_host::RpcArgs;
use durability_host::transport::{
    EndpointPolicy, HttpTransport, InternalToken, InvokeRequest, MAX_RESPONSE_BYTES, Reply,
    Transport,
};
use serde_json::Value;

/// Serves one connection: reads the request head and body, then writes
/// `head` and streams `chunks` (each as one HTTP chunk), then holds the
/// connection open until the client goes away.
fn server(head: String, chunks: Vec<Vec<u8>>) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = s.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            if let Some(split) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let text = String::from_utf8_lossy(&got[..split]).to_ascii_lowercase();
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if got.len() >= split + 4 + len {
                    break;
                }
            }
            if n == 0 {
                return;
            }
        }
        if s.write_all(head.as_bytes()).is_err() {
            return;
        }
        for c in chunks {
            let framed = [
                format!("{:x}\r\n", c.len()).into_bytes(),
                c,
                b"\r\n".to_vec(),
            ]
            .concat();
            if s.write_all(&framed).is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
        // Wait for the client to close.
        let _ = s.read(&mut buf);
    });
    (endpoint, handle)
}

fn request() -> InvokeRequest {
    InvokeRequest {
        class: "Counter".to_owned(),
        name: "c1".to_owned(),
        method: "get".to_owned(),
        args: RpcArgs::new(Value::Null).unwrap(),
        fence: None,
    }
}

async fn send(endpoint: &str) -> Reply {
    let transport = HttpTransport::new(Duration::from_secs(60));
    let endpoint = EndpointPolicy::default().check(endpoint).unwrap();
    let token = InternalToken::new("transport-test-token-0123").unwrap();
    transport.invoke(&endpoint, &token, &request()).await
}

/// `{"ok":true,"result":"…"}` of exactly `len` bytes, in `parts` chunks.
fn envelope_chunks(len: usize, parts: usize) -> Vec<Vec<u8>> {
    let body = format!("{{\"ok\":true,\"result\":\"{}\"}}", "r".repeat(len - 23)).into_bytes();
    let size = body.len().div_ceil(parts);
    body.chunks(size).map(<[u8]>::to_vec).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_oversize_is_refused_before_reading() {
    // The server announces one byte past the cap and sends nothing: a
    // client that tried to buffer would wait for the body.
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        MAX_RESPONSE_BYTES + 1
    );
    let listener_head = head.clone();
    let (endpoint, server) = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf);
            s.write_all(listener_head.as_bytes()).unwrap();
            let _ = s.read(&mut buf);
        });
        (endpoint, handle)
    };
    let reply = send(&endpoint).await;
    match reply {
        Reply::ResultUnknown { reason } => assert!(reason.contains("Content-Length"), "{reason}"),
        other => panic!("{other:?}"),
    }
    tokio::task::spawn_blocking(move || server.join().unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_cut_as_it_crosses_the_cap_and_exactly_the_cap_is_read() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    let (endpoint, server_at) = server(head.to_owned(), envelope_chunks(MAX_RESPONSE_BYTES, 16));
    match send(&endpoint).await {
        Reply::Ok { result, .. } => {
            assert_eq!(result.as_str().map(str::len), Some(MAX_RESPONSE_BYTES - 23));
        }
        other => panic!("{other:?}"),
    }
    tokio::task::spawn_blocking(move || server_at.join().unwrap())
        .await
        .unwrap();
    let (endpoint, server_past) =
        server(head.to_owned(), envelope_chunks(MAX_RESPONSE_BYTES + 1, 16));
    match send(&endpoint).await {
        Reply::ResultUnknown { reason } => assert!(reason.contains("crossed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    tokio::task::spawn_blocking(move || server_past.join().unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_not_sent() {
    // Bind and drop: nothing listens on the port, so the request never
    // left this process (unlike a failure after sending, which is unmarked).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match send(&format!("http://127.0.0.1:{port}")).await {
        Reply::NotSent { .. } => {}
        other => panic!("{other:?}"),
    }
}
