//! The statements of computed placement: the manifest row and the placement
//! exceptions on the journal shard, and the generation fence every data
//! shard holds.

use super::{Dialect, names};
use crate::shard::Statement;
use crate::value::Value;

impl Dialect {
    /// `CREATE TABLE IF NOT EXISTS` statements of the manifest and the
    /// placement exceptions (on the journal shard).
    pub(crate) fn placement_schema(&self) -> Vec<Statement> {
        let (k, t, i, mk) = (
            self.text_key_type(),
            self.text_type(),
            self.int_type(),
            self.mkey_type(),
        );
        vec![
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {m} (scope {k} PRIMARY KEY, revision {i} NOT NULL, body {t} NOT NULL)",
                m = names::MANIFEST
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {x} (scope {k} NOT NULL, mkey {mk} NOT NULL, \
                 shard {t} NOT NULL, epoch {i} NOT NULL, PRIMARY KEY (scope, mkey)){w}",
                x = names::EXCEPTIONS,
                w = self.keyed_table_suffix()
            )),
        ]
    }

    /// `CREATE TABLE IF NOT EXISTS` of the generation fence (on every data
    /// shard).
    pub(crate) fn topology_schema(&self) -> Vec<Statement> {
        let (k, i) = (self.text_key_type(), self.int_type());
        vec![Statement::new(format!(
            "CREATE TABLE IF NOT EXISTS {t} (scope {k} PRIMARY KEY, min_generation {i} NOT NULL)",
            t = names::TOPOLOGY
        ))]
    }

    /// The scope's manifest row (`revision`, `body`).
    pub(crate) fn manifest_get(&self, scope: &str) -> Statement {
        self.scoped("SELECT revision, body FROM ", names::MANIFEST, scope)
            .finish()
    }

    /// Inserts the scope's first manifest unless one exists.
    pub(crate) fn manifest_insert(&self, scope: &str, revision: i64, body: &str) -> Statement {
        self.insert_absent(
            names::MANIFEST,
            &[
                ("scope", scope.into()),
                ("revision", revision.into()),
                ("body", body.into()),
            ],
            1,
        )
    }

    /// The manifest's compare-and-swap: writes `body` at `revision` only
    /// while the row is still at `old_revision`.
    pub(crate) fn manifest_cas(
        &self,
        scope: &str,
        old_revision: i64,
        revision: i64,
        body: &str,
    ) -> Statement {
        self.update(
            names::MANIFEST,
            &[("revision", revision.into()), ("body", body.into())],
            &[("scope", scope.into()), ("revision", old_revision.into())],
        )
        .finish()
    }

    /// The shard's generation fence of the scope (`min_generation`).
    pub(crate) fn fence_get(&self, scope: &str) -> Statement {
        self.scoped("SELECT min_generation FROM ", names::TOPOLOGY, scope)
            .finish()
    }

    /// Raises the fence to `generation` (never lowers it).
    pub(crate) fn fence_raise(&self, scope: &str, generation: i64) -> Vec<Statement> {
        let cols = [
            ("scope", scope.into()),
            ("min_generation", generation.into()),
        ];
        let mut u = self.update(names::TOPOLOGY, &cols[1..], &cols[..1]);
        u.raw(" AND min_generation < ").bind(generation);
        vec![u.finish(), self.insert_absent(names::TOPOLOGY, &cols, 1)]
    }

    /// Records (or replaces) the placement exception of `key`: it lives on
    /// `shard`, found through epoch `epoch`.
    pub(crate) fn exception_put(
        &self,
        scope: &str,
        key: &str,
        shard: &str,
        epoch: u32,
    ) -> Vec<Statement> {
        self.upsert(
            names::EXCEPTIONS,
            &[
                ("scope", scope.into()),
                ("mkey", key.into()),
                ("shard", shard.into()),
                ("epoch", i64::from(epoch).into()),
            ],
            2,
        )
    }

    /// The placement exception of `key` (`shard`), if one is recorded.
    pub(crate) fn exception_get(&self, scope: &str, key: &str) -> Statement {
        self.matching(
            "SELECT shard FROM ",
            names::EXCEPTIONS,
            &scope_key(scope, key),
        )
        .finish()
    }

    /// Deletes the placement exception of `key`.
    pub(crate) fn exception_delete(&self, scope: &str, key: &str) -> Statement {
        self.matching("DELETE FROM ", names::EXCEPTIONS, &scope_key(scope, key))
            .finish()
    }

    /// Up to `limit` placement exceptions with keys after `after`, in key
    /// order (`mkey`, `shard`, `epoch`).
    pub(crate) fn exception_page(&self, scope: &str, after: &str, limit: usize) -> Statement {
        let mut s = self.scoped("SELECT mkey, shard, epoch FROM ", names::EXCEPTIONS, scope);
        s.raw(" AND mkey > ")
            .bind(after)
            .raw(&format!(" ORDER BY mkey LIMIT {limit}"));
        s.finish()
    }
}

/// `scope = ? AND mkey = ?`: a key's placement exception (its primary key).
fn scope_key(scope: &str, key: &str) -> [(&'static str, Value); 2] {
    [("scope", scope.into()), ("mkey", key.into())]
}
