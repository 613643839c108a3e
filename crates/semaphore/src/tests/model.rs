//! A model-based property test of one pool: random acquires, retries of
//! the same key, renewals, uses, releases, clock advances (with and
//! without the alarm) and capacity changes, run against the semaphore on
//! the in-memory store and against a simple model. After every step the
//! answers and the stored accounting must agree with the model, the live
//! grants never exceed the capacity through a new grant, grants are made
//! in arrival order, and no request is granted twice.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::Holder;
use crate::{Acquire, Acquired, EventKind, Outcome, PoolConfig, PoolRow, Released};

/// Where a model request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Queued { deadline: i64 },
    Granted { lease_until: i64, used: u64 },
    Finished { outcome: Outcome, forget_at: i64 },
}

#[derive(Debug, Clone)]
struct Req {
    id: u64,
    holder: String,
    count: u64,
    lease_ms: i64,
    st: St,
}

impl Req {
    fn due(&self) -> i64 {
        match self.st {
            St::Queued { deadline } => deadline,
            St::Granted { lease_until, .. } => lease_until,
            St::Finished { forget_at, .. } => forget_at,
        }
    }
}

/// The model: requests by key, totals, nothing else.
#[derive(Debug, Clone, Default)]
struct Model {
    capacity: u64,
    max_queue: u64,
    retention: i64,
    last_id: u64,
    reqs: BTreeMap<String, Req>,
    granted: u64,
    used: u64,
    released: u64,
    expired: u64,
    timed_out: u64,
    cancelled: u64,
}

/// One answer, as both sides give it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Granted {
        id: u64,
        count: u64,
        lease_until: i64,
        used: u64,
    },
    Queued {
        id: u64,
        position: u64,
        deadline: i64,
    },
    Finished {
        id: u64,
        outcome: Outcome,
    },
    Released(Released),
    Refused(&'static str),
    Done,
}

impl Model {
    fn held(&self) -> u64 {
        self.reqs
            .values()
            .filter(|r| matches!(r.st, St::Granted { .. }))
            .map(|r| r.count)
            .sum()
    }

    fn queue(&self) -> Vec<String> {
        let mut q: Vec<(u64, String)> = self
            .reqs
            .iter()
            .filter(|(_, r)| matches!(r.st, St::Queued { .. }))
            .map(|(k, r)| (r.id, k.clone()))
            .collect();
        q.sort();
        q.into_iter().map(|(_, k)| k).collect()
    }

    fn finish(&mut self, key: &str, outcome: Outcome, now: i64) {
        let forget_at = now + self.retention;
        if let Some(r) = self.reqs.get_mut(key) {
            r.st = St::Finished { outcome, forget_at };
        }
    }

    fn settle(&mut self, now: i64) {
        let due: Vec<String> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.due() <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            match self.reqs[&key].st {
                St::Granted { .. } => {
                    self.expired += self.reqs[&key].count;
                    self.finish(&key, Outcome::Expired, now);
                }
                St::Queued { .. } => {
                    self.timed_out += 1;
                    self.finish(&key, Outcome::TimedOut, now);
                }
                St::Finished { .. } => {
                    self.reqs.remove(&key);
                }
            }
        }
        self.admit(now);
    }

    fn admit(&mut self, now: i64) {
        for key in self.queue() {
            let (count, lease_ms) = (self.reqs[&key].count, self.reqs[&key].lease_ms);
            if count > self.capacity {
                self.cancelled += 1;
                self.finish(&key, Outcome::Cancelled, now);
            } else if self.held() + count <= self.capacity {
                self.granted += count;
                if let Some(r) = self.reqs.get_mut(&key) {
                    r.st = St::Granted {
                        lease_until: now + lease_ms,
                        used: 0,
                    };
                }
            } else {
                return;
            }
        }
    }

    fn answer(&self, key: &str) -> Answer {
        let r = &self.reqs[key];
        match r.st {
            St::Granted { lease_until, used } => Answer::Granted {
                id: r.id,
                count: r.count,
                lease_until,
                used,
            },
            St::Queued { deadline } => Answer::Queued {
                id: r.id,
                position: 1 + self.queue().iter().position(|k| k == key).unwrap_or(0) as u64,
                deadline,
            },
            St::Finished { outcome, .. } => Answer::Finished { id: r.id, outcome },
        }
    }

    fn acquire(&mut self, req: &Acquire, now: i64) -> Answer {
        self.settle(now);
        if let Some(r) = self.reqs.get(&req.key) {
            if r.holder != req.holder || r.count != req.count || r.lease_ms != req.lease_ms {
                return Answer::Refused("SEMAPHORE_KEY_CONFLICT");
            }
            return self.answer(&req.key);
        }
        if req.count > self.capacity {
            return Answer::Refused("SEMAPHORE_COUNT_EXCEEDS_CAPACITY");
        }
        let waiting = self.queue().len() as u64;
        let st = if waiting == 0 && self.held() + req.count <= self.capacity {
            self.granted += req.count;
            St::Granted {
                lease_until: now + req.lease_ms,
                used: 0,
            }
        } else if req.wait_ms == 0 {
            return Answer::Refused("SEMAPHORE_NO_PERMITS");
        } else if waiting >= self.max_queue {
            return Answer::Refused("SEMAPHORE_QUEUE_FULL");
        } else {
            St::Queued {
                deadline: now + req.wait_ms,
            }
        };
        self.last_id += 1;
        let r = Req {
            id: self.last_id,
            holder: req.holder.clone(),
            count: req.count,
            lease_ms: req.lease_ms,
            st,
        };
        self.reqs.insert(req.key.clone(), r);
        self.answer(&req.key)
    }

    /// The key of a live request `id` after settling, or the refusal.
    fn find(&mut self, id: u64, holder: &str, now: i64) -> Result<String, &'static str> {
        self.settle(now);
        let Some((key, r)) = self.reqs.iter().find(|(_, r)| r.id == id) else {
            return Err("SEMAPHORE_UNKNOWN_GRANT");
        };
        if r.holder != holder {
            return Err("SEMAPHORE_NOT_HOLDER");
        }
        Ok(key.clone())
    }

    fn live(&self, key: &str) -> Result<(), &'static str> {
        match self.reqs[key].st {
            St::Granted { .. } => Ok(()),
            St::Queued { .. } => Err("SEMAPHORE_NOT_GRANTED"),
            St::Finished { .. } => Err("SEMAPHORE_FINISHED"),
        }
    }

    fn renew(&mut self, id: u64, holder: &str, now: i64) -> Answer {
        let key = match self
            .find(id, holder, now)
            .and_then(|k| self.live(&k).map(|()| k))
        {
            Ok(k) => k,
            Err(code) => return Answer::Refused(code),
        };
        if let Some(r) = self.reqs.get_mut(&key)
            && let St::Granted { used, .. } = r.st
        {
            r.st = St::Granted {
                lease_until: now + r.lease_ms,
                used,
            };
        }
        self.answer(&key)
    }

    fn used(&mut self, id: u64, holder: &str, total: u64, now: i64) -> Answer {
        let key = match self
            .find(id, holder, now)
            .and_then(|k| self.live(&k).map(|()| k))
        {
            Ok(k) => k,
            Err(code) => return Answer::Refused(code),
        };
        let r = self.reqs.get_mut(&key).unwrap();
        let St::Granted { lease_until, used } = r.st else {
            unreachable!()
        };
        if total > r.count {
            return Answer::Refused("SEMAPHORE_USED_EXCEEDS_COUNT");
        }
        if total > used {
            r.st = St::Granted {
                lease_until,
                used: total,
            };
            self.used += total - used;
        }
        self.answer(&key)
    }

    fn release(&mut self, id: u64, holder: &str, now: i64) -> Answer {
        let key = match self.find(id, holder, now) {
            Ok(k) => k,
            Err(code) => return Answer::Refused(code),
        };
        let r = &self.reqs[&key];
        let outcome = match r.st {
            St::Finished { outcome, .. } => return Answer::Released(Released::Already(outcome)),
            St::Granted { .. } => {
                self.released += r.count;
                Outcome::Released
            }
            St::Queued { .. } => {
                self.cancelled += 1;
                Outcome::Cancelled
            }
        };
        self.finish(&key, outcome, now);
        self.admit(now);
        Answer::Released(Released::Now(outcome))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: u8,
        shard: u8,
        count: u64,
        lease: i64,
        wait: i64,
    },
    Retry {
        key: u8,
    },
    Renew {
        key: u8,
        wrong: bool,
    },
    Used {
        key: u8,
        total: u64,
    },
    Release {
        key: u8,
        wrong: bool,
    },
    Advance {
        ms: i64,
        alarm: bool,
    },
    Capacity {
        capacity: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..8u8, 0..3u8, 1..=4u64, 1..=20i64, 0..=12i64).prop_map(|(key, shard, count, lease, wait)| Op::Acquire {
            key, shard, count, lease: lease * 10, wait: wait * 10
        }),
        2 => (0..8u8).prop_map(|key| Op::Retry { key }),
        2 => (0..8u8, proptest::bool::weighted(0.1)).prop_map(|(key, wrong)| Op::Renew { key, wrong }),
        1 => (0..8u8, 1..=4u64).prop_map(|(key, total)| Op::Used { key, total }),
        2 => (0..8u8, proptest::bool::weighted(0.1)).prop_map(|(key, wrong)| Op::Release { key, wrong }),
        3 => (0..=80i64, any::<bool>()).prop_map(|(ms, alarm)| Op::Advance { ms, alarm }),
        1 => (1..=6u64).prop_map(|capacity| Op::Capacity { capacity }),
    ]
}

fn answer_of(r: Result<Acquired, crate::SemaphoreError>) -> Answer {
    match r {
        Ok(Acquired::Granted(g)) => Answer::Granted {
            id: g.id,
            count: g.count,
            lease_until: g.lease_until,
            used: g.used,
        },
        Ok(Acquired::Queued {
            id,
            position,
            deadline,
        }) => Answer::Queued {
            id,
            position,
            deadline,
        },
        Ok(Acquired::Finished { id, outcome }) => Answer::Finished { id, outcome },
        Err(e) => Answer::Refused(e.code()),
    }
}

fn grant_answer(r: Result<crate::Grant, crate::SemaphoreError>) -> Answer {
    answer_of(r.map(Acquired::Granted))
}

/// One test run: the semaphore, the model, and the last request sent
/// under each key (retried as is).
struct Run {
    h: Holder,
    m: Model,
    sent: BTreeMap<u8, Acquire>,
    max_queue: u64,
    retention: i64,
}

impl Run {
    fn config(&self, capacity: u64) -> PoolConfig {
        PoolConfig::new(capacity)
            .max_queue(self.max_queue)
            .key_retention_ms(self.retention)
    }

    fn id_of(&self, key: u8) -> u64 {
        self.m.reqs.get(&format!("k{key}")).map_or(999, |r| r.id)
    }

    fn holder_of(&self, key: u8, wrong: bool) -> String {
        let holder = self
            .sent
            .get(&key)
            .map_or("s9".to_owned(), |a| a.holder.clone());
        if wrong { format!("{holder}-x") } else { holder }
    }

    /// Applies `op` to both sides: (the semaphore's answer, the model's),
    /// or `None` when the op does not apply.
    fn apply(&mut self, op: &Op, now: i64) -> Option<(Answer, Answer)> {
        let h = &self.h;
        Some(match op {
            Op::Acquire {
                key,
                shard,
                count,
                lease,
                wait,
            } => {
                let req = Acquire::new("p", format!("k{key}"), format!("s{shard}"), *count)
                    .lease_ms(*lease)
                    .wait_ms(*wait);
                let got = answer_of(h.acquire(&req));
                let want = self.m.acquire(&req, now);
                if !matches!(want, Answer::Refused(_)) {
                    self.sent.insert(*key, req);
                }
                (got, want)
            }
            Op::Retry { key } => {
                let req = self.sent.get(key)?;
                (answer_of(h.acquire(req)), self.m.acquire(req, now))
            }
            Op::Renew { key, wrong } => {
                let (id, holder) = (self.id_of(*key), self.holder_of(*key, *wrong));
                let got = grant_answer(h.scheduler.transaction(|tx| h.sem.renew(tx, &holder, id)));
                (got, self.m.renew(id, &holder, now))
            }
            Op::Used { key, total } => {
                let (id, holder) = (self.id_of(*key), self.holder_of(*key, false));
                let got = grant_answer(
                    h.scheduler
                        .transaction(|tx| h.sem.used(tx, &holder, id, *total)),
                );
                (got, self.m.used(id, &holder, *total, now))
            }
            Op::Release { key, wrong } => {
                let (id, holder) = (self.id_of(*key), self.holder_of(*key, *wrong));
                let got = match h.release(&holder, id) {
                    Ok(r) => Answer::Released(r),
                    Err(e) => Answer::Refused(e.code()),
                };
                (got, self.m.release(id, &holder, now))
            }
            Op::Advance { ms, alarm } => {
                h.clock.advance(*ms);
                if *alarm {
                    crate::conformance::run_alarm(&h.scheduler).unwrap();
                    self.m.settle(h.scheduler.now_ms());
                }
                (Answer::Done, Answer::Done)
            }
            Op::Capacity { capacity } => {
                h.configure(self.config(*capacity)).unwrap();
                self.m.capacity = *capacity;
                self.m.settle(now);
                (Answer::Done, Answer::Done)
            }
        })
    }

    /// The stored state agrees with the model and keeps the invariants;
    /// `before` is the pool before the step.
    fn check_state(&self, step: usize, before: &PoolRow) {
        let m = &self.m;
        let (pool, rows, alarm) = self.h.raw();
        let pool = pool.unwrap();
        let totals = (
            pool.granted,
            pool.used,
            pool.released,
            pool.expired,
            pool.timed_out,
            pool.cancelled,
        );
        let model = (
            m.granted,
            m.used,
            m.released,
            m.expired,
            m.timed_out,
            m.cancelled,
        );
        assert_eq!(totals, model, "step {step}: totals");
        assert_eq!(
            pool.held,
            m.held(),
            "step {step}: held is the sum of live grants"
        );
        assert_eq!(pool.queued, m.queue().len() as u64, "step {step}: queued");
        assert_eq!(
            pool.granted,
            pool.released + pool.expired + pool.held,
            "step {step}: granted = returned + held"
        );
        if pool.granted > before.granted {
            assert!(
                pool.held <= pool.capacity,
                "step {step}: a new grant took held {} past capacity {}",
                pool.held,
                pool.capacity
            );
        }
        assert_eq!(rows.len(), m.reqs.len(), "step {step}: rows");
        assert_eq!(
            alarm,
            m.reqs.values().map(Req::due).min(),
            "step {step}: the alarm is the earliest due row"
        );
    }
}

/// Runs `ops` on a pool of `capacity`, `max_queue`, `retention`, checking
/// everything after every step.
fn check(capacity: u64, max_queue: u64, retention: i64, ops: &[Op]) {
    let config = PoolConfig::new(capacity)
        .max_queue(max_queue)
        .key_retention_ms(retention);
    let m = Model {
        capacity,
        max_queue,
        retention,
        ..Model::default()
    };
    let mut run = Run {
        h: Holder::new(Some(config)),
        m,
        sent: BTreeMap::new(),
        max_queue,
        retention,
    };
    for (step, op) in ops.iter().enumerate() {
        let now = run.h.scheduler.now_ms();
        let before = run.h.raw().0.unwrap();
        let saved = run.m.clone();
        let Some((got, want)) = run.apply(op, now) else {
            continue;
        };
        assert_eq!(got, want, "step {step}: {op:?}");
        if matches!(want, Answer::Refused(_)) {
            // A refusal rolls back everything, the settling it did included.
            run.m = saved;
        }
        run.check_state(step, &before);
    }
    // Grants are made in arrival order, each request at most once.
    let granted: Vec<u64> = run
        .h
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Granted { .. }))
        .map(|e| e.id)
        .collect();
    assert!(
        granted.windows(2).all(|w| w[0] < w[1]),
        "FIFO, never twice: {granted:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_pool_behaves_like_the_model(
        capacity in 1..=6u64,
        max_queue in 0..=4u64,
        retention in 20..=300i64,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        check(capacity, max_queue, retention, &ops);
    }
}
