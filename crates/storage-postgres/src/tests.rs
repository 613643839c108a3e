//! Parameter binding and column decoding without a server.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn values_bind_to_inferred_types() {
    let ok = [
        (Value::Integer(7), Type::INT8),
        (Value::Integer(7), Type::INT4),
        (Value::Integer(7), Type::INT2),
        (Value::Integer(1), Type::BOOL),
        (Value::Integer(7), Type::FLOAT8),
        (Value::Real(1.5), Type::FLOAT8),
        (Value::Text("x".into()), Type::TEXT),
        (Value::Text("x".into()), Type::VARCHAR),
        (Value::Blob(vec![1]), Type::BYTEA),
        (Value::Null, Type::INT8),
        (Value::Null, Type::BYTEA),
        (Value::Null, Type::TEXT),
    ];
    for (v, ty) in ok {
        assert!(param(&v, &ty).is_ok(), "{v:?} binds to {ty}");
    }
    let refused = [
        (Value::Integer(i64::MAX), Type::INT4),
        (Value::Integer(2), Type::BOOL),
        (Value::Text("1".into()), Type::INT8),
        (Value::Blob(vec![1]), Type::TEXT),
        (Value::Integer(1), Type::TEXT),
        (Value::Null, Type::TIMESTAMPTZ),
    ];
    for (v, ty) in refused {
        let err = param(&v, &ty).err().unwrap().to_string();
        assert!(!err.is_empty(), "{v:?} is refused for {ty}");
    }
}

#[test]
fn columns_decode_by_type() {
    let v = PgValue::decode(&Type::INT8, &7i64.to_be_bytes()).unwrap();
    assert_eq!(v, Value::Integer(7));
    let v = PgValue::decode(&Type::INT4, &7i32.to_be_bytes()).unwrap();
    assert_eq!(v, Value::Integer(7));
    let v = PgValue::decode(&Type::TEXT, b"hi").unwrap();
    assert_eq!(v, Value::Text("hi".into()));
    let v = PgValue::decode(&Type::BYTEA, &[0, 255]).unwrap();
    assert_eq!(v, Value::Blob(vec![0, 255]));
    assert!(PgValue::decode(&Type::TIMESTAMPTZ, &[0; 8]).is_err());
}
