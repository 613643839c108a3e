//! Regression tests of the migration review (issue 13), on SQLite,
//! PostgreSQL and MariaDB shards: each test fails without its fix. Without a
//! server a test prints that it skipped, unless
//! `DURABILITY_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::shards::{
    Hook, Kind, SAME, Write, clean_verify, coarse_key_ddl, env, hooked, router_replacing,
    router_with_user,
};
use durability_migration::conformance::harness::{purge_expect, repair, user};
use durability_migration::{BackendError, Ident, Router, Shard, Statement, Value, row};

use Kind::{MySql, Postgres, Sqlite};

/// What the hook on a move's source does just before its cutover batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AtCutover {
    /// A repairing verification by another router.
    Repair,
    /// The destination copy is deleted, as a repair that read the key's
    /// claim before the move took it would.
    DeleteCopy,
}

struct BeforeCutover {
    what: AtCutover,
    verifier: OnceLock<Arc<Router>>,
    destination: OnceLock<(Arc<dyn Shard>, String)>,
    fired: AtomicBool,
    seen: Mutex<Option<String>>,
}

impl Hook for BeforeCutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if !w.once(w.is_cutover(), &self.fired) {
            return Ok(());
        }
        match self.what {
            AtCutover::Repair => {
                let v = self.verifier.get().ok_or("no verifier")?;
                let rep = repair(v).await.map_err(|e| e.to_string())?;
                *self.seen.lock().unwrap() = Some(format!("{rep:?}"));
            }
            AtCutover::DeleteCopy => {
                let (dest, key) = self.destination.get().ok_or("no destination")?;
                let d = dest.dialect();
                let st = d.delete_key(
                    &Ident::new("users").unwrap(),
                    &Ident::new("id").unwrap(),
                    key,
                );
                let n = dest.execute(&st).await?;
                *self.seen.lock().unwrap() = Some(format!("deleted {n}"));
            }
        }
        Ok(())
    }
}

/// A key moves s0 → s1 and back with its row unchanged; just before the
/// move back's cutover, `what` happens. The key must end with one live row
/// on s0 holding its value.
async fn move_back_with(kinds: [Kind; 2], what: AtCutover) {
    let Some(e) = env(&kinds).await else { return };
    let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
    r.reassign_shard("u1", "s1", "users").await.unwrap();
    let hook = BeforeCutover {
        what,
        verifier: OnceLock::new(),
        destination: OnceLock::new(),
        fired: AtomicBool::new(false),
        seen: Mutex::new(None),
    };
    let hooked = hooked(&e, "s1", hook);
    let mover = router_replacing(&e, "s1", hooked.clone()).await;
    let _ = hooked.hook.verifier.set(Arc::new(e.router().await));
    let _ = hooked
        .hook
        .destination
        .set((Arc::clone(e.shard("s0")), "u1".to_owned()));
    mover.reassign_shard("u1", "s0", "users").await.unwrap();
    assert!(
        hooked.hook.fired.load(Ordering::SeqCst),
        "{kinds:?}: hook ran"
    );
    let seen = hooked.hook.seen.lock().unwrap().clone();
    let live = e.live("users", "id", "u1").await;
    assert_eq!(
        live.len(),
        1,
        "{kinds:?}: one live row after {seen:?}: {live:?}"
    );
    assert_eq!(live[0].0, "s0", "{kinds:?}");
    assert_eq!(
        live[0].1.get("name"),
        Some(&Value::from("ann")),
        "{kinds:?}"
    );
    assert_eq!(
        r.get("u1", "users").await.unwrap().unwrap().get("n"),
        Some(&Value::Integer(1))
    );
    clean_verify(&r).await;
    assert_eq!(e.live("users", "id", "u1").await.len(), 1, "{kinds:?}");
}

/// Item 1: a repairing verification during a live move back to a shard the
/// key once left (row unchanged, so the copy equals the archived payload
/// behind the old tombstone) leaves the in-flight copy alone: it skips keys
/// whose claim is held.
#[tokio::test]
async fn verify_repair_during_a_move_back_keeps_the_in_flight_copy() {
    for kinds in SAME {
        move_back_with(kinds, AtCutover::Repair).await;
    }
}

/// Item 1: a copy deleted before publish by a repair that checked the claim
/// before the move took it is restored from the snapshot in the publish
/// batch, while the destination still fences the key.
#[tokio::test]
async fn a_copy_deleted_before_publish_is_restored() {
    for kinds in SAME {
        move_back_with(kinds, AtCutover::DeleteCopy).await;
    }
}

/// Inserts an `orgs` row of `u2` on the shard it wraps just before the
/// first cutover batch.
struct OrgAtCutover {
    fired: AtomicBool,
}

impl Hook for OrgAtCutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if w.once(w.is_cutover(), &self.fired) {
            let st = w.inner.dialect().insert_row(
                &Ident::new("orgs").unwrap(),
                &[
                    (Ident::new("org_id").unwrap(), Value::from("u2")),
                    (Ident::new("title").unwrap(), Value::from("late")),
                ],
            );
            w.inner.execute(&st).await?;
        }
        Ok(())
    }
}

async fn partial_move(kinds: [Kind; 2]) {
    let Some(e) = env(&kinds).await else { return };
    let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
    r.insert("u1", "orgs", row([("title", "Acme")]))
        .await
        .unwrap();
    let err = r.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_PARTIAL_MOVE", "{kinds:?}: {err}");
    assert!(!err.is_retryable() && !err.is_outcome_unknown());
    assert!(err.to_string().contains("orgs"), "{err}");
    assert_eq!(r.get_migration_status("u1", "users").await.unwrap(), None);
    for (t, c) in [("users", "id"), ("orgs", "org_id")] {
        let live = e.live(t, c, "u1").await;
        assert_eq!((live.len(), live[0].0.as_str()), (1, "s0"), "{kinds:?} {t}");
    }
    // Every table holding a row moves together.
    r.reassign_keys("u1", "s1", &["users", "orgs"])
        .await
        .unwrap();
    assert_eq!(
        r.get("u1", "orgs").await.unwrap().unwrap().get("title"),
        Some(&Value::from("Acme"))
    );
    // A row that appears in another configured table before the cutover
    // makes the cutover miss: every configured table on both shards moves
    // (the others empty, fenced all the same), so the next copy takes the
    // late row along and nothing is stranded.
    r.insert("u2", "users", user("bo", 2)).await.unwrap();
    let src = r.route("u2").await.unwrap().unwrap();
    let to = if src == "s0" { "s1" } else { "s0" };
    let hooked = hooked(
        &e,
        &src,
        OrgAtCutover {
            fired: AtomicBool::new(false),
        },
    );
    let mover = router_replacing(&e, &src, hooked).await;
    let out = mover.reassign_shard("u2", to, "users").await.unwrap();
    assert_eq!(out.recopies, 1, "{kinds:?}: one missed cutover");
    let users = e.live("users", "id", "u2").await;
    assert_eq!((users.len(), users[0].0.as_str()), (1, to));
    let orgs = e.live("orgs", "org_id", "u2").await;
    assert_eq!((orgs.len(), orgs[0].0.as_str()), (1, to));
    assert_eq!(
        r.get("u2", "orgs").await.unwrap().unwrap().get("title"),
        Some(&Value::from("late")),
        "{kinds:?}: the late row moved with the key and stays routed"
    );
    clean_verify(&r).await;
}

/// Item 6: a move that names only some of the configured tables holding a
/// row of the key is refused with `MIGRATION_PARTIAL_MOVE` before any
/// write; a row appearing in another table during it moves with the key.
#[tokio::test]
async fn a_move_must_include_every_table_holding_a_row_of_the_key() {
    for kinds in SAME {
        partial_move(kinds).await;
    }
}

/// Item 11: a routed insert of a key whose row exists is a definite
/// rejection with its own code (`DUPLICATE_KEY`, not retryable, outcome
/// known), never `SHARD_UNAVAILABLE`; the stored row is untouched.
#[tokio::test]
async fn a_duplicate_insert_is_a_definite_rejection_on_every_dialect() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = e.router().await;
        assert_eq!(r.insert("u1", "users", user("ann", 1)).await.unwrap(), 1);
        let err = r.insert("u1", "users", user("bob", 2)).await.unwrap_err();
        assert_eq!(err.code(), "DUPLICATE_KEY", "{kinds:?}: {err}");
        assert!(!err.is_retryable() && !err.is_outcome_unknown(), "{err}");
        let got = r.get("u1", "users").await.unwrap().unwrap();
        assert_eq!(got.get("name"), Some(&Value::from("ann")), "{kinds:?}");
        // A shard failure that is no constraint violation stays unknown.
        let err = r
            .insert("u2", "users", row([("n", Value::from("not a number"))]))
            .await
            .map(|n| n.to_string());
        if let Err(err) = err {
            assert_ne!(err.code(), "DUPLICATE_KEY", "{kinds:?}: {err}");
        }
    }
}

/// Item 12: the verify report's lists stop at 1,000 entries, and its counts
/// are exact (1,005 ghosts are counted as 1,005).
#[tokio::test]
async fn verify_report_counts_are_exact_beyond_the_list_cap() {
    let Some(e) = env(&[Sqlite, Sqlite]).await else {
        return;
    };
    let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
    let op = r.reassign_shard("u1", "s1", "users").await.unwrap().op_id;
    let s0 = e.shard("s0");
    let d = s0.dialect();
    let mut stmts = Vec::new();
    for i in 0..1005 {
        let k = format!("g{i:04}");
        stmts.push(Statement::with_params(
            "INSERT INTO durability_retired (op_id, tname, mkey, scope, moved_to, payload, \
             digest, retired_ms, superseded, purged) VALUES (?1, 'users', ?2, 'default', 's1', \
             NULL, '-', 0, 0, 0)",
            vec![Value::from(op.as_str()), Value::from(k.as_str())],
        ));
        stmts.push(d.insert_row(
            &Ident::new("users").unwrap(),
            &[(Ident::new("id").unwrap(), Value::from(k.as_str()))],
        ));
    }
    s0.batch(&stmts).await.unwrap();
    // Tombstones of other keys under one operation: only a full pass reads
    // every tombstone.
    let rep = r
        .verify_migrations(durability_migration::VerifyOptions {
            full: true,
            ..durability_migration::VerifyOptions::default()
        })
        .await
        .unwrap();
    assert!(!rep.clean);
    assert_eq!(rep.ghosts.len(), durability_migration::MAX_REPORT_ENTRIES);
    assert_eq!(rep.ghost_count, 1005, "exact total");
    assert_eq!(
        (
            rep.dangling_count,
            rep.stranded_archive_count,
            rep.repaired_count
        ),
        (0, 0, 0)
    );
}

/// Item 3 (b): a key column whose equality is coarser than bytes (SQLite
/// `NOCASE`, a PostgreSQL nondeterministic collation, MariaDB's
/// `utf8mb4_general_ci` and the PAD SPACE `utf8mb4_bin`) is refused when the
/// table is first used, naming the column and the fix; nothing is written.
#[tokio::test]
async fn coarse_key_columns_are_refused_on_every_dialect() {
    for kind in [Sqlite, Postgres, MySql] {
        let Some(e) = env(&[kind]).await else { return };
        let s = e.shard("s0");
        for ddl in coarse_key_ddl(kind) {
            s.execute(&Statement::new(ddl)).await.unwrap();
        }
        let mut tables = vec!["ckeys"];
        if kind == MySql {
            s.execute(&Statement::new(
                "CREATE TABLE pkeys (id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, n BIGINT)",
            ))
            .await
            .unwrap();
            tables.push("pkeys");
        }
        let mut c = e.config(false, 30_000);
        for t in &tables {
            c = c.table(*t);
        }
        let r = Router::new(c).unwrap();
        r.init().await.unwrap();
        for t in tables {
            let err = r.insert("k0", t, row([("n", 1i64)])).await.unwrap_err();
            assert_eq!(err.code(), "KEY_COLUMN_NOT_BYTEWISE", "{kind:?} {t}: {err}");
            assert!(!err.is_retryable());
            let msg = err.to_string();
            assert!(msg.contains("\"id\"") && msg.contains(t), "{msg}");
            // A read of an unmapped key touches no shard; a mapped one is
            // refused too.
            e.mapping.put("k1", "s0").await.unwrap();
            let err = r.get("k1", t).await.unwrap_err();
            assert_eq!(err.code(), "KEY_COLUMN_NOT_BYTEWISE", "{kind:?} {t}: {err}");
            let d = s.dialect();
            let mut q = durability_migration::Sql::new(&d);
            q.raw("SELECT count(*) AS c FROM ")
                .ident(&Ident::new(t).unwrap());
            let rows = s.query(&q.finish()).await.unwrap();
            assert_eq!(
                rows[0].get("c"),
                Some(&Value::Integer(0)),
                "{kind:?}: nothing written"
            );
        }
        // The byte-wise tables of the suite are accepted.
        assert_eq!(r.insert("k0", "users", user("a", 1)).await.unwrap(), 1);
    }
}

/// Runs a routed update of `u1`'s `name` through another router just before
/// the first cutover batch of the shard it wraps.
struct UpdateAtCutover {
    writer: OnceLock<Arc<Router>>,
    name: &'static str,
    fired: AtomicBool,
}

impl Hook for UpdateAtCutover {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        if w.once(w.is_cutover(), &self.fired) {
            let w = self.writer.get().ok_or("no writer")?;
            let n = w
                .update("u1", "cnames", row([("name", self.name)]))
                .await
                .map_err(|e| e.to_string())?;
            if n != 1 {
                return Err(format!("concurrent write changed {n} rows").into());
            }
        }
        Ok(())
    }
}

/// Item 3 (a): the cutover's "unchanged since the snapshot" check compares
/// bytes: a concurrent acknowledged write that changes only case (SQLite
/// `NOCASE`, a PostgreSQL nondeterministic collation) or trailing spaces
/// (MariaDB `utf8mb4_general_ci`, PAD SPACE) makes the cutover miss, and
/// the move carries the new value.
#[tokio::test]
async fn cutover_sees_case_and_trailing_space_changes() {
    for (kind, ddl, name) in [
        (
            Sqlite,
            &["CREATE TABLE cnames (id TEXT PRIMARY KEY, name TEXT COLLATE NOCASE)"][..],
            "ANN",
        ),
        (
            Postgres,
            &[
                "CREATE COLLATION fold_case (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
                "CREATE TABLE cnames (id TEXT PRIMARY KEY, name TEXT COLLATE fold_case)",
            ][..],
            "ANN",
        ),
        (
            MySql,
            &[
                "CREATE TABLE cnames (id VARBINARY(255) PRIMARY KEY, name VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci)",
            ][..],
            "ann ",
        ),
    ] {
        let Some(e) = env(&[kind, kind]).await else {
            return;
        };
        for s in ["s0", "s1"] {
            for stmt in ddl {
                e.shard(s).execute(&Statement::new(*stmt)).await.unwrap();
            }
        }
        let plain = Router::new(e.config(false, 30_000).table("cnames")).unwrap();
        plain.init().await.unwrap();
        e.mapping.put("u1", "s0").await.unwrap();
        plain
            .insert("u1", "cnames", row([("name", "ann")]))
            .await
            .unwrap();
        let hooked = hooked(
            &e,
            "s0",
            UpdateAtCutover {
                writer: OnceLock::new(),
                name,
                fired: AtomicBool::new(false),
            },
        );
        let mover = Router::new(
            e.config(false, 30_000)
                .table("cnames")
                .shard("s0", hooked.clone()),
        )
        .unwrap();
        mover.init().await.unwrap();
        let writer = Router::new(e.config(false, 30_000).table("cnames")).unwrap();
        writer.init().await.unwrap();
        let _ = hooked.hook.writer.set(Arc::new(writer));
        let out = mover.reassign_shard("u1", "s1", "cnames").await.unwrap();
        assert!(hooked.hook.fired.load(Ordering::SeqCst));
        assert!(out.recopies >= 1, "{kind:?}: the cutover missed: {out:?}");
        let live = e.live("cnames", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kind:?}: {live:?}");
        assert_eq!(live[0].0, "s1");
        assert_eq!(
            live[0].1.get("name"),
            Some(&Value::from(name)),
            "{kind:?}: the acknowledged write is in the moved row"
        );
    }
}

/// Item 5: under computed placement a key's rows live together. A key whose
/// `users` row was placed under an older epoch gets its new `orgs` row on
/// the same shard (writes probe every configured table), and a read hit
/// through an older epoch records no placement exception while another shard
/// holds a row of the key in another table (it would hide that row).
#[tokio::test]
async fn computed_placement_keeps_a_keys_tables_together() {
    for kind in [Sqlite, Postgres, MySql] {
        let Some(e) = env(&[kind, kind, kind]).await else {
            return;
        };
        let r = Router::new(
            e.config(false, 30_000)
                .placement(durability_migration::Placement::Computed)
                .manifest_refresh_ms(0),
        )
        .unwrap();
        r.init().await.unwrap();
        let m1 = r.manifest_from_journal().await.unwrap();
        let keys: Vec<String> = (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| m1.owner(k) == Some("s2"))
            .take(2)
            .collect();
        for k in &keys {
            r.insert(k, "users", user("ann", 1)).await.unwrap();
        }
        r.add_epoch(&["s0", "s1"]).await.unwrap();
        let m2 = r.manifest_from_journal().await.unwrap();
        // A new row of another table joins the key's rows on s2.
        let k = &keys[0];
        r.insert(k, "orgs", row([("title", "Acme")])).await.unwrap();
        let orgs = e.live("orgs", "org_id", k).await;
        assert_eq!((orgs.len(), orgs[0].0.as_str()), (1, "s2"), "{kind:?}");
        assert!(r.get(k, "users").await.unwrap().is_some());
        assert_eq!(
            r.update(k, "orgs", row([("title", "B")])).await.unwrap(),
            1,
            "{kind:?}"
        );
        // A key split over two shards (written there by other means): a
        // read of one table records no exception that would hide the other.
        let k = &keys[1];
        let newest = m2.owner(k).unwrap();
        let s = e.shard(newest);
        let st = s.dialect().insert_row(
            &Ident::new("orgs").unwrap(),
            &[
                (Ident::new("org_id").unwrap(), Value::from(k.as_str())),
                (Ident::new("title").unwrap(), Value::from("split")),
            ],
        );
        s.execute(&st).await.unwrap();
        assert!(r.get(k, "users").await.unwrap().is_some(), "{kind:?}");
        assert_eq!(
            e.mapping.get(k).await.unwrap(),
            None,
            "{kind:?}: no exception"
        );
        assert_eq!(
            r.get(k, "orgs").await.unwrap().unwrap().get("title"),
            Some(&Value::from("split")),
            "{kind:?}: the other table's row stays readable"
        );
    }
}

/// Runs a whole move through `mover` (its clock then advanced) at the first
/// recovery-lease renewal of a verification pass on the shard it wraps.
struct MoveDuringPass {
    mover: OnceLock<Arc<Router>>,
    clock: durability_migration::ManualClock,
    fired: AtomicBool,
}

impl Hook for MoveDuringPass {
    async fn before(&self, w: Write<'_>) -> Result<(), BackendError> {
        let renew = w.stmts.iter().any(|s| {
            s.sql
                .starts_with("UPDATE durability_migration_lease SET expires_ms")
        });
        if w.once(renew, &self.fired) {
            let m = self.mover.get().ok_or("no mover")?;
            self.clock.advance(10);
            let opts = durability_migration::MoveOptions {
                retire: durability_migration::Retire::Immediate,
            };
            m.reassign_shard_with("u2", "s1", "users", opts)
                .await
                .map_err(|e| e.to_string())?;
            self.clock.advance(1_000);
        }
        Ok(())
    }
}

/// Item 9: `NOT_VERIFIED` is satisfied only by a clean pass that started
/// after the move finished: a move that finished while a pass ran stays
/// refused until the next pass.
#[tokio::test]
async fn a_move_finished_during_a_clean_pass_is_not_verified_by_it() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "u2", "s0", user("ann", 1)).await;
        let hooked = hooked(
            &e,
            "s0",
            MoveDuringPass {
                mover: OnceLock::new(),
                clock: e.clock.clone(),
                fired: AtomicBool::new(false),
            },
        );
        let verifier = router_replacing(&e, "s0", hooked.clone()).await;
        let _ = hooked.hook.mover.set(Arc::new(e.router().await));
        let rep = repair(&verifier).await.unwrap();
        assert!(hooked.hook.fired.load(Ordering::SeqCst), "{kinds:?}");
        assert!(rep.clean, "{kinds:?}: {rep:?}");
        e.clock.advance(1_000);
        let purge = purge_expect(&r, (0, 1), &format!("{kinds:?}")).await;
        assert_eq!(purge.refused[0].error.code(), "NOT_VERIFIED", "{kinds:?}");
        // A pass that starts after the move finished covers it.
        clean_verify(&r).await;
        purge_expect(&r, (1, 0), &format!("{kinds:?}")).await;
    }
}

/// A router caches the columns of a table it has used: a column added
/// afterwards is accepted by routed writes (the cache is re-read on a
/// miss instead of refusing with `UNKNOWN_COLUMN`), and a move copies it.
#[tokio::test]
async fn a_column_added_after_first_use_is_written_and_moved() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
        assert_eq!(
            r.get("u1", "users").await.unwrap().unwrap().get("note"),
            None
        );
        for s in ["s0", "s1"] {
            e.shard(s)
                .execute(&Statement::new("ALTER TABLE users ADD COLUMN note TEXT"))
                .await
                .unwrap();
        }
        let note = |v: &str| row([("note", Value::from(v))]);
        assert_eq!(
            r.update("u1", "users", note("first")).await.unwrap(),
            1,
            "{kinds:?}"
        );
        e.mapping.put("u2", "s1").await.unwrap();
        let mut with_note = user("bo", 2);
        with_note.insert("note".into(), Value::from("second"));
        assert_eq!(
            r.insert("u2", "users", with_note).await.unwrap(),
            1,
            "{kinds:?}"
        );
        // A column the table does not have is still a definite refusal.
        let err = r
            .update("u1", "users", row([("nope", Value::from(1))]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "UNKNOWN_COLUMN", "{kinds:?}: {err}");
        r.reassign_shard("u1", "s1", "users").await.unwrap();
        let live = e.live("users", "id", "u1").await;
        assert_eq!(live.len(), 1, "{kinds:?}");
        assert_eq!(live[0].0, "s1", "{kinds:?}");
        assert_eq!(
            live[0].1.get("note"),
            Some(&Value::from("first")),
            "{kinds:?}"
        );
        clean_verify(&r).await;
    }
}

/// A move re-validates both tables once its validation is older than
/// `schema_recheck_ms` (MariaDB keeps no schema version): a key column made
/// coarser than bytes after the router first used it (here
/// `utf8mb4_general_ci`) refuses the move with `KEY_COLUMN_NOT_BYTEWISE`
/// before any write; the row stays where it was. Within the window the
/// move does not see the change, but its key matches compare bytes: a move
/// of `u1` onto the shard holding `U1` (the same key to the collation)
/// never takes `U1` for its copy's row (a key match under the collation
/// deleted it), it is refused by the unique key and aborts, and both rows
/// stay.
#[tokio::test]
async fn a_move_sees_a_key_collation_changed_after_first_use() {
    let Some(e) = env(&[MySql, MySql]).await else {
        return;
    };
    let r = e.router().await;
    e.mapping.put("u1", "s0").await.unwrap();
    e.mapping.put("U1", "s1").await.unwrap();
    r.insert("u1", "users", user("ann", 1)).await.unwrap();
    r.insert("U1", "users", user("bo", 2)).await.unwrap();
    // The inserts validated both tables just now.
    e.shard("s1")
        .execute(&Statement::new(
            "ALTER TABLE users MODIFY id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci",
        ))
        .await
        .unwrap();
    let err = r.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "MIGRATION_COPY_REJECTED", "{err}");
    for (k, n) in [("u1", 1), ("U1", 2)] {
        let rows = e
            .shard(if k == "u1" { "s0" } else { "s1" })
            .query(&Statement::with_params(
                "SELECT n FROM users WHERE CAST(id AS BINARY) = CAST(? AS BINARY)",
                vec![k.into()],
            ))
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{k}");
        assert_eq!(rows[0].get("n"), Some(&Value::from(n)), "{k}");
    }
    assert_eq!(
        r.get_migration_status("u1", "users")
            .await
            .unwrap()
            .map(|o| o.state.as_str()),
        Some("aborted")
    );
    // Past the window the move validates afresh and refuses.
    e.clock
        .advance(i64::try_from(durability_migration::DEFAULT_SCHEMA_RECHECK_MS).unwrap());
    let err = r.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "KEY_COLUMN_NOT_BYTEWISE", "{err}");
    assert!(err.to_string().contains("id"), "{err}");
    let live = e.live("users", "id", "u1").await;
    assert_eq!((live.len(), live[0].0.as_str()), (1, "s0"));
}

/// On SQLite a move re-reads a table's columns only when the shard's
/// schema version changed since it last validated them: a unique index
/// with a coarser collation added to the key column after a move validated
/// the table changes the version, and the next move sees it and refuses
/// with `KEY_COLUMN_NOT_BYTEWISE` before any write.
#[tokio::test]
async fn a_sqlite_move_sees_a_key_index_added_after_a_validated_move() {
    let Some(e) = env(&[Sqlite, Sqlite]).await else {
        return;
    };
    let r = e.router().await;
    for (k, s, n) in [("u1", "s0", 1), ("u2", "s1", 2), ("u3", "s0", 3)] {
        e.mapping.put(k, s).await.unwrap();
        r.insert(k, "users", user("ann", n)).await.unwrap();
    }
    // Validates both tables at the current schema versions.
    r.reassign_shard("u3", "s1", "users").await.unwrap();
    e.shard("s1")
        .execute(&Statement::new(
            "CREATE UNIQUE INDEX users_id_nocase ON users (id COLLATE NOCASE)",
        ))
        .await
        .unwrap();
    let err = r.reassign_shard("u1", "s1", "users").await.unwrap_err();
    assert_eq!(err.code(), "KEY_COLUMN_NOT_BYTEWISE", "{err}");
    let live = e.live("users", "id", "u1").await;
    assert_eq!((live.len(), live[0].0.as_str()), (1, "s0"));
}

/// Item 3 (a) on PostgreSQL: the byte-wise comparison of text values goes
/// through the column type's own text form, so a row of `char(n)` (padded),
/// `varchar` and nondeterministic-collation columns still equals its
/// snapshot: the move cuts over at its first attempt and carries the
/// values unchanged.
#[tokio::test]
async fn a_postgres_move_of_padded_and_folded_text_cuts_over_at_once() {
    let Some(e) = env(&[Postgres, Postgres]).await else {
        return;
    };
    for s in ["s0", "s1"] {
        for stmt in [
            "CREATE COLLATION fold_case (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
            "CREATE TABLE ptext (id TEXT PRIMARY KEY, c CHAR(8), v VARCHAR(16), f TEXT COLLATE fold_case)",
        ] {
            e.shard(s).execute(&Statement::new(stmt)).await.unwrap();
        }
    }
    let r = Router::new(e.config(false, 30_000).table("ptext")).unwrap();
    r.init().await.unwrap();
    e.mapping.put("p1", "s0").await.unwrap();
    r.insert(
        "p1",
        "ptext",
        row([("c", "ab"), ("v", "Mixed Case "), ("f", "ÄbC")]),
    )
    .await
    .unwrap();
    let before = r.get("p1", "ptext").await.unwrap().unwrap();
    let out = r.reassign_shard("p1", "s1", "ptext").await.unwrap();
    assert_eq!(out.recopies, 0, "the snapshot equals the row: {out:?}");
    let live = e.live("ptext", "id", "p1").await;
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].0, "s1");
    assert_eq!(live[0].1, before, "the values moved unchanged");
    clean_verify(&r).await;
}

/// A finished move's in-flight marker left behind (a stalled mover's stale
/// copy batch, landing after the move finished, leaves one; so does a hand
/// edit) fences the key's live row: its routed writes fail. Verify reports
/// it (not clean); repair leaves it (nothing tells whether the row under it
/// is the key's live row or one the application deleted); once the
/// operator deletes it, the key is writable again and verify is clean.
#[tokio::test]
async fn verify_reports_a_leftover_in_flight_marker_and_repair_leaves_it() {
    for kinds in SAME {
        let Some(e) = env(&kinds).await else { return };
        let r = router_with_user(&e, "u1", "s0", user("ann", 1)).await;
        let op = r.reassign_shard("u1", "s1", "users").await.unwrap().op_id;
        let s1 = e.shard("s1");
        let d = s1.dialect();
        let mut s = durability_migration::Sql::new(&d);
        s.raw(
            "INSERT INTO durability_retired (op_id, tname, mkey, scope, moved_to, digest, \
             retired_ms, superseded, purged) VALUES (",
        )
        .bind(op.as_str())
        .raw(", ")
        .bind("users")
        .raw(", ")
        .bind("u1")
        .raw(", ")
        .bind(r.journal_scope())
        .raw(", ")
        .bind("s0")
        .raw(", ")
        .bind("in-flight")
        .raw(", ")
        .bind(0i64)
        .raw(", 0, 0)");
        s1.execute(&s.finish()).await.unwrap();
        let n = |v: i64| row([("n", Value::from(v))]);
        let err = r.update("u1", "users", n(2)).await.unwrap_err();
        assert_eq!(err.code(), "MIGRATION_CUTOVER_PENDING", "{kinds:?}: {err}");
        let expected = vec![durability_migration::Leftover {
            shard: "s1".into(),
            table: "users".into(),
            key: "u1".into(),
            op_id: op.clone(),
        }];
        for repair in [false, true] {
            let rep = r
                .verify_migrations(durability_migration::VerifyOptions {
                    repair,
                    ..durability_migration::VerifyOptions::default()
                })
                .await
                .unwrap();
            assert!(!rep.clean, "{kinds:?}: {rep:?}");
            assert_eq!(rep.leftover_marker_count, 1, "{kinds:?}: {rep:?}");
            assert_eq!(rep.leftover_markers, expected, "{kinds:?}");
            assert_eq!(rep.repaired_count, 0, "{kinds:?}: {rep:?}");
        }
        let mut s = durability_migration::Sql::new(&d);
        s.raw("DELETE FROM durability_retired WHERE op_id = ")
            .bind(op.as_str())
            .raw(" AND digest = ")
            .bind("in-flight");
        assert_eq!(s1.execute(&s.finish()).await.unwrap(), 1, "{kinds:?}");
        assert_eq!(r.update("u1", "users", n(3)).await.unwrap(), 1, "{kinds:?}");
        assert_eq!(
            r.get("u1", "users").await.unwrap().unwrap().get("n"),
            Some(&Value::from(3)),
            "{kinds:?}"
        );
        clean_verify(&r).await;
    }
}

/// `schema_recheck_ms` is validated: above [`MAX_MAPPING_CACHE_TTL_MS`] is
/// `INVALID_CONFIG` and no router is built; the maximum and 0 are accepted.
#[tokio::test]
async fn a_bad_schema_recheck_is_a_typed_error() {
    let Some(e) = env(&[Sqlite, Sqlite]).await else {
        return;
    };
    let max = durability_migration::MAX_MAPPING_CACHE_TTL_MS;
    let err = Router::new(e.config(false, 30_000).schema_recheck_ms(max + 1)).unwrap_err();
    assert_eq!(err.code(), "INVALID_CONFIG", "{err}");
    for ok in [0, max] {
        assert!(Router::new(e.config(false, 30_000).schema_recheck_ms(ok)).is_ok());
    }
}
