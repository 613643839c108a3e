//! WebSocket sessions on an object owned by the caller's own host: the
//! handler gets the object, runs under the host's admission, and its
//! session ends when the host drains; refusals before dispatch.

use durability_host::connect::{ConnectRequest, Message, Socket};
use durability_host::{Handle, HostError};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;

use crate::support::{Counter, TestHost, World};

type H = Handle<Counter, SqliteAlarmIndex>;

async fn text(socket: &mut Socket) -> Option<String> {
    match socket.recv().await {
        Some(Ok(Message::Text(t))) => Some(t),
        Some(Ok(other)) => panic!("unexpected {other:?}"),
        Some(Err(_)) | None => None,
    }
}

#[tokio::test]
async fn a_local_session_runs_on_the_object_and_ends_when_the_host_drains() {
    let w = World::new();
    let config = w.config("a").connect(
        "Counter",
        |h: H, req: ConnectRequest, mut socket: Socket| async move {
            socket
                .send(Message::Text(format!(
                    "hello url={} gen={}",
                    req.url, h.generation
                )))
                .await?;
            while let Some(message) = socket.recv().await {
                if message? == Message::Text("incr".to_owned()) {
                    let n = h.scheduler.transaction(|tx| h.object.incr(tx))?;
                    socket.send(Message::Text(format!("n={n}"))).await?;
                }
            }
            Ok(())
        },
    );
    let host: TestHost = TestHost::start(config).await.unwrap();
    let mut socket = host
        .object_by_name("Counter", "c1")
        .connect(ConnectRequest::new("/ws?x=1"))
        .await
        .unwrap();
    let greeting = text(&mut socket).await.unwrap();
    assert!(greeting.starts_with("hello url=/ws?x=1 gen="), "{greeting}");
    for want in ["n=1", "n=2"] {
        socket.send(Message::Text("incr".to_owned())).await.unwrap();
        assert_eq!(text(&mut socket).await.as_deref(), Some(want));
    }
    let r = host.probe().routing;
    assert_eq!((r.local, r.upgrades, r.handoffs), (1, 1, 0));
    // The session is not admitted work: the drain does not wait for it,
    // and it ends the session (the handler's future is dropped).
    assert_eq!(host.probe().in_flight, 0);
    host.shutdown().await;
    assert_eq!(
        text(&mut socket).await,
        None,
        "the session ended with the drain"
    );
    eprintln!("tried: a local session ran two increments on c1, then the drain closed it");
}

#[tokio::test]
async fn connects_are_refused_before_dispatch() {
    let w = World::new();
    let host: TestHost = w.host("a").await;
    // The class has no connect handler.
    let e = host
        .object_by_name("Counter", "c1")
        .connect(ConnectRequest::new("/ws"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, HostError::UnknownMethod { method, .. } if method == "connect"),
        "{e:?}"
    );
    for (class, url, code) in [
        ("Counter", "no-path", "host_invalid_request"),
        ("Nope", "/ws", "host_unknown_class"),
    ] {
        let e = host
            .object_by_name(class, "c1")
            .connect(ConnectRequest::new(url))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{class} {url}");
    }
    assert_eq!(host.probe().routing.upgrades, 0);
    // A connect handler for a class that is not configured refuses start.
    let config = w.config("b").connect(
        "Ghost",
        |_h: H, _req: ConnectRequest, _socket: Socket| async move { Ok(()) },
    );
    let e = TestHost::start(config).await.unwrap_err();
    assert!(
        matches!(
            e,
            HostError::InvalidSetting {
                setting: "connect",
                ..
            }
        ),
        "{e:?}"
    );
}
