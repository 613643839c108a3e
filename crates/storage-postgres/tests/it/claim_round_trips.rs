//! Round trips of claiming and renewing a whole class (16 scopes), counted
//! on the wire: the store talks to the server through a proxy of this test
//! that counts the client's turns (a burst of bytes from the client after
//! the server last spoke, or first). One statement is one turn; claiming
//! the class with `claim_many` takes one, claiming it scope by scope takes
//! sixteen, and `renew_many` renews it in one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use durability_ownership::{ClaimOutcome, Claimant, LeaseStore, ShardCount, TaskId};
use durability_storage_postgres::SchemaName;
use durability_storage_postgres::ownership::PostgresLeaseStore;
use durability_storage_postgres::testkit::url;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::ownership::active;
use crate::pg::{class_scopes, schema};

/// Who sent the last bytes on a proxied connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Nobody,
    Client,
    Server,
}

/// A TCP proxy to the test server counting client turns.
pub(crate) struct TurnProxy {
    pub(crate) port: u16,
    pub(crate) turns: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TurnProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, counting a turn when `me` is the client and the
/// other side spoke last (or nobody did).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    me: Side,
    last: Arc<std::sync::Mutex<Side>>,
    turns: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        {
            let mut l = last.lock().unwrap();
            if me == Side::Client && *l != Side::Client {
                turns.fetch_add(1, Ordering::SeqCst);
            }
            *l = me;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

pub(crate) async fn start_proxy(upstream: (String, u16)) -> TurnProxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let turns = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&turns);
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect((upstream.0.as_str(), upstream.1))
                .await
                .unwrap();
            let last = Arc::new(std::sync::Mutex::new(Side::Nobody));
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let t = Arc::clone(&counted);
            tokio::spawn(pump(
                cr,
                sw,
                Side::Client,
                Arc::clone(&last),
                Arc::clone(&t),
            ));
            tokio::spawn(pump(sr, cw, Side::Server, last, t));
        }
    });
    TurnProxy { port, turns, task }
}

/// The test server's address and a config reaching it through `port`.
pub(crate) fn through(port: u16) -> ((String, u16), tokio_postgres::Config) {
    let direct: tokio_postgres::Config = url().parse().unwrap();
    let host = match direct.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let upstream = (host, direct.get_ports().first().copied().unwrap_or(5432));
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(port);
    if let Some(u) = direct.get_user() {
        config.user(u);
    }
    if let Some(p) = direct.get_password() {
        config.password(p);
    }
    if let Some(d) = direct.get_dbname() {
        config.dbname(d);
    }
    (upstream, config)
}

#[tokio::test]
async fn claiming_a_class_of_16_scopes_takes_one_round_trip() {
    let Some(schema) = schema().await else { return };
    let (upstream, _) = through(0);
    let proxy = start_proxy(upstream).await;
    let (_, config) = through(proxy.port);
    // One connection, so every statement goes the same way.
    let store = PostgresLeaseStore::new(
        config,
        1,
        SchemaName::new(schema.name()).unwrap(),
        ShardCount::default(),
    )
    .unwrap();
    store.setup().await.unwrap();
    let (lifecycle, storage) = active(&store, "rt").await;
    let task = TaskId::new("host-a").unwrap();
    // Prepare every statement on the connection first (a prepare is a turn
    // of its own, once per connection).
    let warm = class_scopes(&storage, "Warm");
    store
        .claim_many(&warm[..2], Claimant::new(&lifecycle, &task, 60_000))
        .await;
    store
        .claim(&warm[2], &lifecycle, &task, 60_000)
        .await
        .unwrap();
    let counted = |before: u64| proxy.turns.load(Ordering::SeqCst) - before;

    let scopes = class_scopes(&storage, "Cart");
    let before = proxy.turns.load(Ordering::SeqCst);
    let claims = store
        .claim_many(&scopes, Claimant::new(&lifecycle, &task, 60_000))
        .await;
    let batched = counted(before);
    let records: Vec<_> = claims
        .into_iter()
        .map(|c| match c.unwrap() {
            ClaimOutcome::Claimed(l) => l.record,
            ClaimOutcome::Held(_) => panic!("a fresh scope was held"),
        })
        .collect();
    assert_eq!(records.len(), 16);

    let one_by_one_scopes = class_scopes(&storage, "Room");
    let before = proxy.turns.load(Ordering::SeqCst);
    for s in &one_by_one_scopes {
        assert!(matches!(
            store.claim(s, &lifecycle, &task, 60_000).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
    }
    let one_by_one = counted(before);

    store.renew_many(&records[..2], 60_000).await;
    let before = proxy.turns.load(Ordering::SeqCst);
    let renewed = store.renew_many(&records, 60_000).await;
    let renew_trips = counted(before);
    assert!(renewed.iter().all(Result::is_ok));
    eprintln!(
        "16 scopes: claim_many {batched} round trip(s), claim one by one {one_by_one}, renew_many {renew_trips}"
    );
    assert_eq!(batched, 1, "claim_many of a class");
    assert_eq!(one_by_one, 16, "one claim per scope");
    assert_eq!(renew_trips, 1, "renew_many of a class");
}
