//! How a typed handler's error and a typed call's answer are classified.

#![allow(clippy::unwrap_used)]

use durability_ownership::DispatchOutcome;
use durability_scheduler::{StorageError, StorageErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::*;
use crate::error::MAX_METHOD_MESSAGE_BYTES;

struct Shop;

impl Class for Shop {
    const NAME: &'static str = "Shop";
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum ShopError {
    #[error("sold out")]
    SoldOut,
    #[error("the shop's storage failed")]
    Storage(
        #[serde(skip)]
        #[source]
        Option<StorageError>,
    ),
}

impl AppError for ShopError {
    fn code(&self) -> &str {
        match self {
            Self::SoldOut => "sold_out",
            Self::Storage(_) => "storage",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Buy;

impl Method for Buy {
    type Class = Shop;
    const NAME: &'static str = "buy";
    type Out = u32;
    type Error = ShopError;
}

#[test]
fn a_fence_refusal_inside_the_apps_own_error_stays_fenced() {
    let fenced = StorageError::new(StorageErrorKind::Fenced, "a newer claim");
    let e = classify::<ShopError>(Box::new(ShopError::Storage(Some(fenced))));
    assert_eq!(e.code(), "host_fenced", "{e}");
    assert!(e.is_retryable());
    // Another storage failure wrapped the same way is the method's own.
    let backend = StorageError::new(StorageErrorKind::Backend, "disk");
    let e = classify::<ShopError>(Box::new(ShopError::Storage(Some(backend))));
    assert_eq!(e.code(), "host_method_error", "{e}");
}

#[test]
fn the_methods_own_error_is_encoded_with_its_code_message_and_details() {
    match classify::<ShopError>(Box::new(ShopError::SoldOut)) {
        HostError::Method {
            code,
            message,
            details,
        } => assert_eq!(
            (code.as_str(), message.as_str(), details),
            ("sold_out", "sold out", Some(json!("SoldOut")))
        ),
        other => panic!("{other:?}"),
    }
    // Any other error is the handler's failure.
    let e = classify::<ShopError>("boom".into());
    assert_eq!(e.code(), "host_handler_failed");
    assert_eq!(e.wire().code, "internal_error");
}

#[test]
fn a_typed_call_decodes_its_answer_strictly() {
    assert_eq!(decode::<Buy>(Ok(json!(7))).unwrap(), 7);
    // A success that is not a u32: the method ran, its result is unknown.
    let e = decode::<Buy>(Ok(json!("seven"))).unwrap_err();
    assert_eq!(e.code(), "do_rpc_result_unknown");
    assert_eq!(e.outcome(), DispatchOutcome::Unknown);
    // The method's own error, decoded.
    let own =
        HostError::method(MethodError::new("sold_out", "sold out").with_details(json!("SoldOut")));
    assert!(matches!(
        decode::<Buy>(Err(own)),
        Err(CallError::Method(ShopError::SoldOut))
    ));
    // Details that are not a ShopError stay the host's method error.
    let odd = HostError::method(MethodError::new("odd", "odd").with_details(json!({"x": 1})));
    match decode::<Buy>(Err(odd)) {
        Err(CallError::Host(HostError::Method { code, .. })) => assert_eq!(code, "odd"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_long_method_message_is_cut_at_a_character_boundary_once() {
    let long = "é".repeat(MAX_METHOD_MESSAGE_BYTES);
    match HostError::method(MethodError::new("long", long)) {
        HostError::Method { message, .. } => {
            assert!(message.len() <= MAX_METHOD_MESSAGE_BYTES);
            assert_eq!(message.len(), MAX_METHOD_MESSAGE_BYTES);
            assert!(message.chars().all(|c| c == 'é'));
        }
        other => panic!("{other:?}"),
    }
}
