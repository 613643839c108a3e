//! The pair tables' SQL is pinned: the tables the hand-written stores
//! created before keep working unchanged.

use super::{ALLOCATIONS, MAPPING, PairTable};
use crate::dialect::Dialect;
use crate::value::Value;

#[test]
fn schemas_match_the_tables_already_stored() {
    let cases = [
        (
            Dialect::Sqlite,
            "CREATE TABLE IF NOT EXISTS durability_mapping (mkey TEXT PRIMARY KEY, shard TEXT NOT NULL) WITHOUT ROWID",
        ),
        (
            Dialect::Postgres,
            "CREATE TABLE IF NOT EXISTS durability_mapping (mkey TEXT COLLATE \"C\" PRIMARY KEY, shard TEXT NOT NULL)",
        ),
        (
            Dialect::MySql,
            "CREATE TABLE IF NOT EXISTS durability_mapping (mkey VARBINARY(512) PRIMARY KEY, shard VARBINARY(255) NOT NULL)",
        ),
    ];
    for (d, sql) in cases {
        assert_eq!(PairTable::new(&d, MAPPING).schema().sql, sql, "{d:?}");
        assert_eq!(
            PairTable::new(&d, ALLOCATIONS).schema().sql,
            sql.replace("durability_mapping", "durability_allocations"),
            "{d:?}"
        );
    }
}

#[test]
fn statements_are_the_dialects_own() {
    let pg = PairTable::new(&Dialect::Postgres, MAPPING);
    assert_eq!(
        pg.upsert("k", "s").sql,
        "INSERT INTO durability_mapping (mkey, shard) VALUES ($1, $2) \
         ON CONFLICT (mkey) DO UPDATE SET shard = excluded.shard"
    );
    assert_eq!(
        pg.insert_absent("k", "s").sql,
        "INSERT INTO durability_mapping (mkey, shard) VALUES ($1, $2) ON CONFLICT (mkey) DO NOTHING"
    );
    let lite = PairTable::new(&Dialect::Sqlite, ALLOCATIONS);
    assert_eq!(
        lite.page_after("a", 10).sql,
        "SELECT mkey, shard FROM durability_allocations WHERE mkey > ?1 ORDER BY mkey LIMIT ?2"
    );
    assert_eq!(
        lite.insert_absent("k", "s").sql,
        "INSERT OR IGNORE INTO durability_allocations (mkey, shard) VALUES (?1, ?2)"
    );
    let my = PairTable::new(&Dialect::MySql, MAPPING);
    let up = my.upsert("k", "s");
    assert_eq!(
        up.sql,
        "INSERT INTO durability_mapping (mkey, shard) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE shard = VALUES(shard)"
    );
    assert_eq!(
        up.params,
        vec![Value::Blob(b"k".to_vec()), Value::Blob(b"s".to_vec())],
        "keys are bytes on MariaDB/MySQL"
    );
    assert_eq!(
        my.insert_absent("k", "s").sql,
        "INSERT IGNORE INTO durability_mapping (mkey, shard) VALUES (?, ?)"
    );
    assert!(PairTable::check(&Dialect::Other("x".into())).is_err());
}
