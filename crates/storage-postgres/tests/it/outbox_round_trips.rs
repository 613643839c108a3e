//! Round trips of the outbox on the wire, counted by the proxy of
//! `claim_round_trips` (a client turn is a burst of bytes from the client
//! after the server last spoke): staging 100 entries takes one, and a
//! delivered batch two (`BEGIN` with the settlements of the batch before
//! and the due rows' `SELECT`, then the claims' `UPDATE` with `COMMIT`);
//! and a claim refused inside its
//! transaction never hands the connection back to the pool mid-transaction.

use std::sync::atomic::Ordering;

use durability_outbox::{ChannelConfig, Entry, Sink, SinkError};
use durability_storage_postgres::outbox::{PgDeliverer, PgOutbox};
use durability_storage_postgres::testkit::TestSchema;

use crate::claim_round_trips::{start_proxy, through};

/// A sink that accepts everything and counts it.
#[derive(Clone, Default)]
struct Count(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Sink<String> for Count {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        self.0.fetch_add(batch.len() as u64, Ordering::SeqCst);
        Ok(())
    }
}

async fn stage_many(client: &mut tokio_postgres::Client, outbox: &PgOutbox, from: usize, n: usize) {
    let keys: Vec<String> = (from..from + n).map(|i| format!("k-{i}")).collect();
    let entries: Vec<(&str, String)> = keys.iter().map(|k| (k.as_str(), k.clone())).collect();
    let tx = client.transaction().await.unwrap();
    outbox.stage_batch(&tx, "rt", &entries).await.unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn staging_takes_one_round_trip_and_a_delivered_batch_two() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let (upstream, _) = through(0);
    let proxy = start_proxy(upstream).await;
    let (_, config) = through(proxy.port);
    let outbox = PgOutbox::new(schema.name()).unwrap();
    let (mut client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    outbox.setup(&mut client).await.unwrap();
    let sink = Count::default();
    // One connection, so every statement of the deliverer goes one way.
    let deliverer = PgDeliverer::new(
        &outbox,
        config,
        1,
        ChannelConfig::new("rt").batch_size(100),
        sink.clone(),
    )
    .unwrap();
    // Warm up: the deliverer prepares its statements once per connection.
    stage_many(&mut client, &outbox, 0, 100).await;
    assert_eq!(deliverer.deliver_due().await.unwrap().delivered, 100);

    let tx = client.transaction().await.unwrap();
    let before = proxy.turns.load(Ordering::SeqCst);
    let keys: Vec<String> = (0..100).map(|i| format!("s-{i}")).collect();
    let entries: Vec<(&str, String)> = keys.iter().map(|k| (k.as_str(), k.clone())).collect();
    outbox.stage_batch(&tx, "rt", &entries).await.unwrap();
    assert_eq!(
        proxy.turns.load(Ordering::SeqCst) - before,
        1,
        "100 entries staged in one statement"
    );
    tx.commit().await.unwrap();
    stage_many(&mut client, &outbox, 100, 200).await;

    let before = proxy.turns.load(Ordering::SeqCst);
    assert_eq!(deliverer.deliver_due().await.unwrap().delivered, 300);
    let turns = proxy.turns.load(Ordering::SeqCst) - before;
    // Three batches of two turns, then two claims that find nothing
    // (`BEGIN` + settlements + `SELECT`, then `COMMIT`): the one made ahead
    // while the last batch was published (it settles the one before), and
    // one that settles the last batch.
    assert_eq!(
        turns,
        3 * 2 + 2 * 2,
        "round trips of delivering 300 entries"
    );
    assert_eq!(sink.0.load(Ordering::SeqCst), 400);
    assert!(deliverer.is_empty().await.unwrap());
}

#[tokio::test]
async fn a_claim_refused_in_its_transaction_leaves_no_connection_mid_transaction() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let config: tokio_postgres::Config =
        durability_storage_postgres::testkit::url().parse().unwrap();
    let outbox = PgOutbox::new(schema.name()).unwrap();
    let (mut client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    outbox.setup(&mut client).await.unwrap();
    stage_many(&mut client, &outbox, 0, 5).await;
    let s = schema.name();
    // The claims' UPDATE is refused: the transaction that read and locked
    // the due rows aborts.
    client
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$BEGIN RAISE EXCEPTION 'claims refused'; END$$;
             CREATE TRIGGER refuse BEFORE UPDATE ON {s}.outbox \
             FOR EACH ROW EXECUTE FUNCTION {s}.refuse();"
        ))
        .await
        .unwrap();
    let sink = Count::default();
    // One pooled connection: the next claim gets the same one, unless the
    // refused claim's was closed.
    let deliverer =
        PgDeliverer::new(&outbox, config, 1, ChannelConfig::new("rt"), sink.clone()).unwrap();
    let refused = deliverer.deliver_due().await.unwrap_err();
    assert_eq!(refused.code(), "PG_OUTBOX_REJECTED", "{refused}");
    assert!(!refused.is_outcome_unknown());
    assert_eq!(
        deliverer
            .pending("k-0")
            .await
            .unwrap()
            .map(|(_, attempt)| attempt),
        Some(0),
        "nothing of the refused claim landed"
    );
    client
        .batch_execute(&format!("DROP TRIGGER refuse ON {s}.outbox"))
        .await
        .unwrap();
    assert_eq!(deliverer.deliver_due().await.unwrap().delivered, 5);
    assert_eq!(sink.0.load(Ordering::SeqCst), 5);
    assert!(deliverer.is_empty().await.unwrap());
    let idle_in_transaction: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state LIKE 'idle in transaction%' \
             AND query LIKE '%FOR UPDATE SKIP LOCKED%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        idle_in_transaction, 0,
        "no connection left in a transaction"
    );
}
