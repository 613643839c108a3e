//! Outbox codecs (issue 15, outbox item 1): a channel chooses its codec,
//! staging refuses a value that does not read back through it with a typed
//! error naming the cause, and a stored entry that cannot be decoded at
//! delivery is dead-lettered or dropped, reported by `deliver_due` and
//! `publish_now`, and never retried.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::{Arc, Mutex};

use durability_outbox::{
    ChannelConfig, Codec, CodecError, DeadLetter, DeadReason, Entry, EventKind, Fate, Json, Outbox,
    OutboxError, OutboxEvent, RetryPolicy, Sink, SinkError,
};
use durability_scheduler::{ManualClock, Scheduler, Storage};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use support::{fresh_sqlite, sql};

/// An internally tagged enum: postcard cannot decode it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Event {
    Created { id: u32 },
    Deleted { id: u32, reason: String },
}

/// A sink that keeps every value it was handed.
struct Collect<T>(Arc<Mutex<Vec<(String, u64, T)>>>);

impl<T: Clone + Send + Sync + 'static> Sink<T> for Collect<T> {
    async fn publish(&self, batch: &[Entry<T>]) -> Result<(), SinkError> {
        let mut got = self.0.lock().unwrap();
        for e in batch {
            got.push((e.key().to_owned(), e.version(), e.value().clone()));
        }
        Ok(())
    }
}

type Got<T> = Arc<Mutex<Vec<(String, u64, T)>>>;
type Letters<T> = Arc<Mutex<Vec<DeadLetter<T>>>>;

struct Chan<S: Storage, T> {
    sched: Scheduler<S>,
    outbox: Outbox<S, T, Collect<T>>,
    got: Got<T>,
    events: Arc<Mutex<Vec<OutboxEvent>>>,
}

fn chan<S, T>(storage: Arc<S>, clock: &ManualClock, config: ChannelConfig<T>) -> Chan<S, T>
where
    S: Storage,
    for<'t> S::Tx<'t>: durability_outbox::OutboxTx,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let sched = support::scheduler_on("object-1", storage, clock).unwrap();
    let (events, hook) = support::event_log();
    let got: Got<T> = Arc::default();
    let outbox = Outbox::attach(&sched, config.on_event(hook), Collect(got.clone())).unwrap();
    Chan {
        sched,
        outbox,
        got,
        events,
    }
}

impl<S, T> Chan<S, T>
where
    S: Storage,
    for<'t> S::Tx<'t>: durability_outbox::OutboxTx,
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    /// Stages `value` under `key` in a transaction of its own.
    fn stage(&self, key: &str, value: &T) -> Result<u64, OutboxError> {
        self.sched
            .transaction(|tx| self.outbox.stage(tx, key, value))
    }
}

/// The value bytes of the one stored outbox row.
fn stored_value(storage: &durability_storage_sqlite::SqliteStorage) -> Vec<u8> {
    support::query_one(storage, "SELECT value FROM durability_outbox")
}

fn dead_letters<T: Send + 'static>(letters: &Letters<T>) -> durability_outbox::DeadLetterFn<T> {
    let l = letters.clone();
    Arc::new(move |letter| {
        l.lock().unwrap().push(letter);
        Box::pin(async { Ok(()) })
    })
}

#[tokio::test]
async fn postcard_channels_refuse_values_that_do_not_round_trip_naming_the_cause() {
    let (clock, _dir, storage) = fresh_sqlite();
    let tagged: Chan<_, Event> = chan(storage.clone(), &clock, ChannelConfig::new("tagged"));
    let err = tagged.stage("k", &Event::Created { id: 1 }).unwrap_err();
    assert_eq!(err.code(), "OUTBOX_VALUE_NOT_ROUND_TRIP");
    assert!(!err.is_retryable());
    let OutboxError::ValueDoesNotRoundTrip { codec, reason } = &err else {
        panic!("expected ValueDoesNotRoundTrip, got {err:?}");
    };
    assert_eq!(*codec, "postcard");
    assert!(
        reason.contains("postcard cannot decode") && reason.contains("JSON codec"),
        "the error names the cause and the way out: {reason}"
    );
    assert!(tagged.outbox.is_empty().unwrap(), "nothing was staged");
    assert_eq!(tagged.sched.alarm_at(), None, "the alarm did not move");
    assert!(tagged.events.lock().unwrap().is_empty(), "no Staged event");

    let values: Chan<_, serde_json::Value> =
        chan(storage.clone(), &clock, ChannelConfig::new("values"));
    let err = values
        .stage("k", &serde_json::json!({"limit": 5, "tags": ["a"]}))
        .unwrap_err();
    assert_eq!(err.code(), "OUTBOX_VALUE_NOT_ROUND_TRIP");
    assert!(err.to_string().contains("postcard"), "{err}");

    // Refused stages consumed no version: the next one is version 1.
    let plain: Chan<_, String> = chan(storage, &clock, ChannelConfig::new("plain"));
    let v = plain.stage("k", &"ok".to_owned()).unwrap();
    assert_eq!(v, 1);
}

#[tokio::test]
async fn a_json_channel_delivers_tagged_enums_and_json_values() {
    let (clock, _dir, storage) = fresh_sqlite();
    let events: Chan<_, Event> = chan(
        storage.clone(),
        &clock,
        ChannelConfig::new("events").codec(Json),
    );
    let e1 = Event::Deleted {
        id: 7,
        reason: "gone".into(),
    };
    events.stage("k", &e1).unwrap();
    let stored: Vec<u8> = stored_value(&storage);
    assert_eq!(
        stored[0],
        durability_outbox::JSON_FORMAT,
        "format byte first"
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&stored[1..]).unwrap(),
        serde_json::json!({"type": "Deleted", "id": 7, "reason": "gone"})
    );
    let report = events.outbox.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 1);
    assert!(report.is_clean());
    assert_eq!(events.got.lock().unwrap()[0].2, e1);

    let values: Chan<_, serde_json::Value> =
        chan(storage, &clock, ChannelConfig::new("values").codec(Json));
    let value = serde_json::json!({"limit": 5, "nested": {"b": [1, 2.5, null], "a": true}});
    values.stage("k", &value).unwrap();
    let outcome = values.outbox.publish_now("k").await.unwrap();
    assert!(outcome.is_done());
    assert_eq!(values.got.lock().unwrap()[0].2, value);

    // JSON cannot hold a non-finite float: refused, naming the codec.
    let floats: Chan<_, f64> = chan(memory_store(), &clock, ChannelConfig::new("f").codec(Json));
    let err = floats.stage("k", &f64::NAN).unwrap_err();
    assert_eq!(err.code(), "OUTBOX_VALUE_NOT_ROUND_TRIP");
    assert!(err.to_string().contains("json"), "{err}");
}

fn memory_store() -> Arc<durability_scheduler::testkit::MemoryStorage> {
    support::memory()
}

/// A lossy custom codec: keeps at most 3 bytes of a string.
struct Truncating;

impl Codec<String> for Truncating {
    fn name(&self) -> &'static str {
        "truncating"
    }
    fn format(&self) -> u8 {
        200
    }
    fn encode(&self, value: &String, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend(value.bytes().take(3));
        Ok(())
    }
    fn decode(&self, payload: &[u8]) -> Result<String, CodecError> {
        String::from_utf8(payload.to_vec()).map_err(|e| CodecError::new(e.to_string()))
    }
    fn check_round_trip(&self, value: &String, payload: &[u8]) -> Result<(), CodecError> {
        if &self.decode(payload)? == value {
            Ok(())
        } else {
            Err(CodecError::new("value longer than 3 bytes"))
        }
    }
}

#[tokio::test]
async fn a_custom_codec_writes_the_stored_bytes_and_its_round_trip_check_guards_staging() {
    let (clock, _dir, storage) = fresh_sqlite();
    let c: Chan<_, String> = chan(
        storage.clone(),
        &clock,
        ChannelConfig::new("c").codec(Truncating),
    );
    let err = c.stage("long", &"abcdef".to_owned()).unwrap_err();
    assert_eq!(err.code(), "OUTBOX_VALUE_NOT_ROUND_TRIP");
    assert!(err.to_string().contains("truncating"), "{err}");
    c.stage("short", &"abc".to_owned()).unwrap();
    let stored: Vec<u8> = stored_value(&storage);
    assert_eq!(stored, vec![200, b'a', b'b', b'c']);
    assert_eq!(c.outbox.deliver_due().await.unwrap().delivered, 1);
    assert_eq!(c.got.lock().unwrap()[0].2, "abc");
}

#[tokio::test]
async fn an_undecodable_stored_entry_goes_to_the_dead_letter_sink_and_is_never_retried() {
    let (clock, _dir, storage) = fresh_sqlite();
    let letters: Letters<String> = Arc::default();
    // A dead-letter sink without a maximum: it receives undecodable entries
    // while healthy ones retry forever.
    let c: Chan<_, String> = chan(
        storage.clone(),
        &clock,
        ChannelConfig::new("c").dead_letter(dead_letters(&letters)),
    );
    let (v, _) = c
        .sched
        .transaction(|tx| {
            let v = c.outbox.stage(tx, "bad", &"x".to_owned())?;
            let w = c.outbox.stage(tx, "good", &"y".to_owned())?;
            Ok::<_, OutboxError>((v, w))
        })
        .unwrap();
    // The stored bytes become something postcard cannot read as a String:
    // the postcard format byte, then a length longer than what follows.
    sql(
        &storage,
        "UPDATE durability_outbox SET value = x'01ff' WHERE key = 'bad'",
    );
    let report = c.outbox.deliver_due().await.unwrap();
    assert_eq!(report.delivered, 1, "the healthy entry is delivered");
    assert_eq!(report.undecodable.len(), 1);
    let u = &report.undecodable[0];
    assert_eq!(
        (u.key.as_str(), u.version, u.fate),
        ("bad", v, Fate::DeadLettered)
    );
    assert!(u.error.contains("postcard"), "{}", u.error);
    let got = letters.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].reason, DeadReason::Undecodable);
    assert_eq!(got[0].value, None);
    assert_eq!(got[0].bytes, vec![1, 0xff], "the stored bytes are kept");
    assert_eq!(got[0].version, v);
    let delivered: Vec<String> = c.got.lock().unwrap().iter().map(|d| d.0.clone()).collect();
    assert_eq!(
        delivered,
        ["good"],
        "the sink never saw the undecodable entry"
    );
    assert!(c.outbox.is_empty().unwrap(), "nothing left to retry");
    assert_eq!(c.sched.alarm_at(), None, "no alarm: nothing retries");
    assert!(c.events.lock().unwrap().iter().any(|e| e.key == "bad"
        && matches!(&e.kind, EventKind::DeadLettered { error } if error.contains("decode"))));
    clock.advance(600_000);
    assert_eq!(
        c.outbox.deliver_due().await.unwrap(),
        durability_outbox::DeliveryReport::default()
    );
}

#[tokio::test]
async fn without_a_dead_letter_sink_an_undecodable_entry_is_dropped_and_publish_now_says_so() {
    let (clock, _dir, storage) = fresh_sqlite();
    let c: Chan<_, String> = chan(storage.clone(), &clock, ChannelConfig::new("c"));
    c.stage("k", &"x".to_owned()).unwrap();
    // An unknown format byte: a value written by some other codec.
    sql(&storage, "UPDATE durability_outbox SET value = x'09aabb'");
    let outcome = c.outbox.publish_now("k").await.unwrap();
    assert!(!outcome.pending, "dropped, not pending");
    assert!(!outcome.is_done(), "and not reported as delivered");
    assert_eq!(outcome.report.delivered, 0);
    assert_eq!(outcome.report.undecodable.len(), 1);
    assert_eq!(outcome.report.undecodable[0].fate, Fate::Dropped);
    assert!(
        outcome.report.undecodable[0].error.contains("format 9"),
        "{}",
        outcome.report.undecodable[0].error
    );
    assert!(
        c.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e.kind, EventKind::Dropped { .. }))
    );
    assert!(c.got.lock().unwrap().is_empty());
    assert!(c.outbox.is_empty().unwrap());
}

#[tokio::test]
async fn entries_staged_under_another_codec_are_dead_lettered_not_misread() {
    let (clock, _dir, storage) = fresh_sqlite();
    {
        let c: Chan<_, String> = chan(storage.clone(), &clock, ChannelConfig::new("c"));
        c.stage("k", &"staged with postcard".to_owned()).unwrap();
    }
    let letters: Letters<String> = Arc::default();
    let c: Chan<_, String> = chan(
        storage,
        &clock,
        ChannelConfig::new("c")
            .codec(Json)
            .retry(RetryPolicy {
                max_attempts: Some(3),
                ..RetryPolicy::default()
            })
            .dead_letter(dead_letters(&letters)),
    );
    let report = c.outbox.deliver_due().await.unwrap();
    assert_eq!(report.undecodable.len(), 1);
    assert_eq!(report.undecodable[0].fate, Fate::DeadLettered);
    assert!(report.undecodable[0].error.contains("json"));
    assert_eq!(report.retried, 0, "never retried");
    let got = letters.lock().unwrap().clone();
    assert_eq!(got[0].bytes[0], durability_outbox::POSTCARD_FORMAT);
    assert_eq!(got[0].attempts, 1);
    assert!(c.got.lock().unwrap().is_empty());
}
