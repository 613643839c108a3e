//! A delivering process for the outbox's process tests: delivers one
//! channel of the outbox in a schema, recording every entry its sink
//! receives in the table `seen` of that schema, and then (with `hang`)
//! never returns from the sink, so the test can SIGKILL it mid-delivery.
//!
//! Usage: `durability-pg-outbox-worker URL SCHEMA CHANNEL (hang|ack)`.

use durability_outbox::{ChannelConfig, Entry, Sink, SinkError};
use durability_storage_postgres::outbox::{PgDeliverer, PgOutbox};
use tokio_postgres::NoTls;

struct Record {
    client: tokio_postgres::Client,
    insert: String,
    hang: bool,
}

impl Sink<String> for Record {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        for e in batch {
            let version = i64::try_from(e.version()).map_err(|e| SinkError::new(e.to_string()))?;
            self.client
                .execute(&self.insert, &[&e.key(), &version])
                .await
                .map_err(|e| SinkError::new(e.to_string()))?;
        }
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

async fn work(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [url, schema, channel, mode] = args else {
        return Err("usage: URL SCHEMA CHANNEL (hang|ack)".into());
    };
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let outbox = PgOutbox::new(schema)?;
    let sink = Record {
        client,
        insert: format!("INSERT INTO {schema}.seen (key, version) VALUES ($1, $2)"),
        hang: mode == "hang",
    };
    let config = ChannelConfig::new(channel.clone())
        .batch_size(10)
        .attempt_timeout_ms(60_000);
    let deliverer = PgDeliverer::new(&outbox, url.parse()?, 2, config, sink)?;
    deliverer.run(std::future::pending()).await;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(work(&args))
}
