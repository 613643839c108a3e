//! Support for suites that run against a real Redis, where each test keeps
//! its keys under a prefix of its own.

use redis::aio::ConnectionManager;

/// Deletes every key that starts with `prefix` (`KEYS`, then one `DEL`):
/// for a test's own prefix, not for a production keyspace (`KEYS` blocks the
/// server while it walks every key).
///
/// # Errors
/// Redis's error.
pub async fn delete_prefix(mut c: ConnectionManager, prefix: &str) -> redis::RedisResult<()> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await?;
    if !keys.is_empty() {
        let () = redis::cmd("DEL").arg(keys).query_async(&mut c).await?;
    }
    Ok(())
}
