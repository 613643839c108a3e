//! Tests of the operator views on the in-memory index.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::{MemoryAlarmIndex, Token};

#[tokio::test]
async fn jobs_are_listed_by_prefix_and_counted() {
    let ix = MemoryAlarmIndex::new();
    for (id, due) in [("s1:b", 20), ("s1:a", 10), ("s2:c", 30)] {
        ix.upsert(
            &ObjectId::new(id).unwrap(),
            &Token::new(format!("t-{}", id.replace(':', "-"))).unwrap(),
            due,
        )
        .await
        .unwrap();
    }
    let page = list_jobs(&ix, "s1:", None, 10).await.unwrap();
    assert_eq!(page.prefix, "s1:");
    assert_eq!(page.cursor, None);
    let listed: Vec<_> = page
        .jobs
        .iter()
        .map(|j| {
            (
                j.object.as_str(),
                j.token.as_str(),
                j.due_at,
                j.state,
                j.tries,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("s1:a", "t-s1-a", 10, "due", 0),
            ("s1:b", "t-s1-b", 20, "due", 0)
        ]
    );
    let c = counts(&ix).await.unwrap();
    assert_eq!((c.scheduled, c.ready, c.total), (3, 0, 3));
    assert!(list_jobs(&ix, "s1:", None, 0).await.is_err(), "limit 0");
}
