//! Objects as portable images on PostgreSQL: an image written by
//! `import_image` reads back the same through `export_image`; an existing
//! object is refused unless replaced; a failing import records nothing;
//! what the image cannot carry refuses the export.

use durability_scheduler::Storage;
use durability_scheduler::image::{
    CAPABILITY_TABLES, Column, ColumnType, ObjectImage, Table, Value,
};

use crate::object_support::TestDeployment;

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

/// One row in every capability table and two own tables.
fn sample() -> ObjectImage {
    let rows: Vec<Vec<Vec<Value>>> = vec![
        vec![
            vec![text("alarms"), Value::Integer(1)],
            vec![text("outbox"), Value::Integer(2)],
            vec![text("topology"), Value::Integer(1)],
        ],
        vec![vec![text("outbox"), Value::Integer(17)]],
        vec![vec![Value::Integer(17)]],
        vec![vec![
            text("c"),
            text("k"),
            Value::Blob(vec![1, 2]),
            Value::Integer(3),
            Value::Integer(1),
            Value::Integer(17),
            Value::Null,
        ]],
        vec![vec![Value::Integer(3)]],
        vec![vec![
            text("c"),
            text("bad"),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            text("why"),
            Value::Integer(5),
        ]],
        vec![vec![Value::Integer(40), text("tok"), Value::Null]],
        vec![vec![
            text("g"),
            Value::Integer(2),
            text("[\"a\"]"),
            Value::Integer(1),
            Value::Integer(9),
        ]],
        vec![vec![text("g"), text("ch"), text("v")]],
        vec![
            vec![text("g"), Value::Integer(11)],
            vec![text("g"), Value::Integer(12)],
        ],
    ];
    let mut tables: Vec<Table> = CAPABILITY_TABLES
        .iter()
        .zip(rows)
        .map(|(def, rows)| Table {
            name: def.name.to_owned(),
            columns: def.columns(),
            primary_key: def.key.iter().map(|k| (*k).to_owned()).collect(),
            rows,
        })
        .collect();
    let col = |name: &str, ty, not_null| Column {
        name: name.to_owned(),
        ty,
        not_null,
    };
    tables.push(Table {
        name: "orders".to_owned(),
        columns: vec![
            col("id", ColumnType::Integer, true),
            col("total", ColumnType::Real, false),
            col("note", ColumnType::Text, true),
            col("raw", ColumnType::Blob, false),
        ],
        primary_key: vec!["id".to_owned()],
        rows: vec![
            vec![
                Value::Integer(1),
                Value::Real(2.5),
                text("é"),
                Value::Blob(vec![0, 255]),
            ],
            vec![Value::Integer(2), Value::Null, text("b"), Value::Null],
        ],
    });
    tables.push(Table {
        name: "log".to_owned(),
        columns: vec![col("line", ColumnType::Text, false)],
        primary_key: vec![],
        rows: vec![vec![text("B")], vec![text("a")], vec![Value::Null]],
    });
    ObjectImage { tables }
}

fn exported(d: &TestDeployment, id: &str) -> ObjectImage {
    d.objects
        .open(id)
        .unwrap()
        .transaction(|tx| tx.export_image())
        .unwrap()
}

#[test]
fn an_imported_image_exports_the_same() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let image = sample();
    image.check().unwrap();
    d.objects
        .import_image("st:Shop:a", "st", &image, false)
        .unwrap();
    let mut back = exported(&d, "st:Shop:a");
    // Rows without a key come back in bytewise order, `NULL` first (as
    // SQLite sorts).
    let expected = {
        let mut e = image.clone();
        let log = e.tables.iter_mut().find(|t| t.name == "log").unwrap();
        log.rows = vec![vec![Value::Null], vec![text("B")], vec![text("a")]];
        e
    };
    back.tables.sort_by(|a, b| a.name.cmp(&b.name));
    let mut expected = expected;
    expected.tables.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(back, expected);
    // Another object's rows are not part of it.
    d.objects
        .import_image("st:Shop:b", "st", &image, false)
        .unwrap();
    assert_eq!(exported(&d, "st:Shop:a").tables.len(), image.tables.len());
}

#[test]
fn an_existing_object_is_refused_unless_replaced_and_a_failed_import_writes_nothing() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let image = sample();
    d.objects
        .import_image("st:Shop:a", "st", &image, false)
        .unwrap();
    let before = exported(&d, "st:Shop:a");
    let e = d
        .objects
        .import_image("st:Shop:a", "st", &ObjectImage::default(), false)
        .unwrap_err();
    assert_eq!(e.code(), "IMAGE_TARGET_NOT_EMPTY");
    assert_eq!(exported(&d, "st:Shop:a"), before);
    // A replacement that fails half-way (a duplicate key in its last
    // table) leaves the old object whole.
    let mut broken = image.clone();
    let orders = broken
        .tables
        .iter_mut()
        .find(|t| t.name == "orders")
        .unwrap();
    orders.rows[1][0] = Value::Integer(1);
    let e = d
        .objects
        .import_image("st:Shop:a", "st", &broken, true)
        .unwrap_err();
    assert_eq!(e.code(), "IMAGE_STORAGE", "{e}");
    assert_eq!(exported(&d, "st:Shop:a"), before);
    // A fresh object that fails is not recorded at all.
    let e = d
        .objects
        .import_image("st:Shop:new", "st", &broken, false)
        .unwrap_err();
    assert_eq!(e.code(), "IMAGE_STORAGE");
    assert!(!d.objects.is_recorded("st:Shop:new").unwrap());
    // A replacement that succeeds holds only the new state.
    d.objects
        .import_image("st:Shop:a", "st", &ObjectImage::default(), true)
        .unwrap();
    let now = exported(&d, "st:Shop:a");
    assert!(now.tables.iter().all(|t| t.rows.is_empty()), "{now:?}");
    assert!(now.table("orders").is_none());
    // A tombstoned storage id takes no import.
    d.objects
        .write_tombstone("gone", "life", "deleted")
        .unwrap();
    let e = d
        .objects
        .import_image("gone:Shop:a", "gone", &image, false)
        .unwrap_err();
    assert_eq!(e.code(), "IMAGE_INVALID");
    assert!(!d.objects.is_recorded("gone:Shop:a").unwrap());
}

#[test]
fn what_the_image_cannot_carry_refuses_the_export() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    for (i, (sql, what)) in [
        ("CREATE INDEX t_v ON t (v)", "t_v"),
        ("CREATE VIEW w AS SELECT 1 AS one", "w"),
        ("ALTER TABLE t ADD COLUMN d BIGINT DEFAULT 3", "t.d"),
        ("ALTER TABLE t ADD COLUMN j JSONB", "t.j"),
        ("ALTER TABLE t ADD CONSTRAINT pos CHECK (k > 0)", "pos"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("st:Shop:{i}");
        let storage = d.objects.open(&id).unwrap();
        storage
            .transaction(|tx| {
                tx.sql()
                    .batch_execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT)")?;
                tx.sql().batch_execute(sql)
            })
            .unwrap();
        let e = storage.transaction(|tx| tx.export_image()).unwrap_err();
        assert_eq!(e.code(), "IMAGE_NOT_PORTABLE", "{sql}");
        assert!(e.to_string().contains(what), "{e} for {sql}");
    }
}
