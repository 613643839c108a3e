//! Method-name grammar and argument limits, at the boundary and one past.

use serde_json::{Value, json};

use super::*;

#[test]
fn method_names_follow_the_identifier_grammar() {
    for ok in ["a", "_x", "$y", "incr", "get2", "A_b$c"] {
        assert!(validate_method(ok).is_ok(), "{ok} should pass");
    }
    let at_limit = "m".repeat(MAX_METHOD_BYTES);
    assert!(validate_method(&at_limit).is_ok());
    let past = "m".repeat(MAX_METHOD_BYTES + 1);
    for bad in [
        "",
        "1a",
        "a-b",
        "a b",
        "é",
        "a.b",
        "toString()",
        past.as_str(),
    ] {
        let err = validate_method(bad).expect_err(bad);
        assert_eq!(err.code(), "host_invalid_method", "{bad}");
        assert_eq!(err.wire().code, "invalid_method");
    }
}

/// A JSON string value whose encoding is exactly `n` bytes.
fn string_of_encoded_len(n: usize) -> Value {
    Value::String("x".repeat(n - 2))
}

#[test]
fn arguments_are_capped_at_one_mebibyte_encoded() {
    let at = RpcArgs::new(string_of_encoded_len(MAX_ARGS_BYTES)).expect("exactly 1 MiB");
    assert_eq!(at.encoded().len(), MAX_ARGS_BYTES);
    let err = RpcArgs::new(string_of_encoded_len(MAX_ARGS_BYTES + 1)).expect_err("1 MiB + 1");
    assert_eq!(err.code(), "host_invalid_args");
    let text =
        serde_json::to_string(&string_of_encoded_len(MAX_ARGS_BYTES + 1)).unwrap_or_default();
    assert_eq!(
        RpcArgs::from_json(&text).map(|_| ()).map_err(|e| e.code()),
        Err("host_invalid_args")
    );
}

/// Arguments measured by their encoding, not their bound: escapes count
/// at their escaped length, arrays at their commas, at the cap and one
/// past.
#[test]
fn the_cap_counts_escapes_and_punctuation_as_encoded() {
    // `"\u0001..."`: six bytes a character plus the quotes.
    let escaped = |n: usize| Value::String("\u{1}".repeat(n));
    let fits = (MAX_ARGS_BYTES - 2) / 6;
    let at = RpcArgs::new(escaped(fits)).expect("escapes under the cap");
    assert_eq!(at.encoded().len(), fits * 6 + 2);
    assert!(RpcArgs::new(escaped(fits + 1)).is_err());
    // `[0,0,...]`: two bytes an element, one less a comma, plus brackets.
    let zeros = |n: usize| Value::Array(vec![json!(0); n]);
    let n = (MAX_ARGS_BYTES - 1) / 2;
    let at = RpcArgs::new(zeros(n)).expect("an array under the cap");
    assert_eq!(at.encoded().len(), 2 * n + 1);
    assert_eq!(
        RpcArgs::new(zeros(n + 1)).map(|_| ()).map_err(|e| e.code()),
        Err("host_invalid_args")
    );
    // Small arguments (settled by the bound) keep their value and encoding.
    let small = json!({"pad": "p".repeat(256), "n": [1, -2, 2.5], "ok": true, "z": null});
    let args = RpcArgs::new(small.clone()).expect("small");
    assert_eq!(args.value(), &small);
    assert_eq!(args.encoded(), small.to_string());
}

#[test]
fn wire_arguments_must_be_structural_json() {
    for bad in [
        "NaN",
        "[1, NaN]",
        "Infinity",
        "{\"a\": -Infinity}",
        "[1,,2]",
        "undefined",
        "{a:1}",
        "'x'",
        "\"\\ud800\"",
    ] {
        let err = RpcArgs::from_json(bad).expect_err(bad);
        assert_eq!(err.code(), "host_invalid_args", "{bad}");
    }
    let ok = RpcArgs::from_json("{\"a\":[1,2.5,\"s\",true,null,{}]}").expect("structural");
    assert_eq!(ok.value(), &json!({"a": [1, 2.5, "s", true, null, {}]}));
}

#[test]
fn arguments_nested_past_the_depth_limit_are_refused() {
    let mut at = Value::Null;
    for _ in 0..MAX_ARGS_DEPTH {
        at = Value::Array(vec![at]);
    }
    assert!(RpcArgs::new(at.clone()).is_ok());
    let past = Value::Array(vec![at]);
    assert_eq!(
        RpcArgs::new(past).map(|_| ()).map_err(|e| e.code()),
        Err("host_invalid_args")
    );
}

#[test]
fn method_error_codes_have_a_grammar() {
    assert!(MethodError::code_is_valid("out_of_stock"));
    assert!(MethodError::code_is_valid(&"a".repeat(64)));
    for bad in ["", "Upper", "with-dash", "sp ace", &"a".repeat(65)] {
        assert!(!MethodError::code_is_valid(bad), "{bad}");
    }
}
