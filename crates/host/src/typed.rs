//! Typed methods: a [`Method`] names its class, its wire name, its result
//! and its error as types, so registering a handler of another class, or
//! calling with the wrong argument type or expecting the wrong result, does
//! not compile. JSON on the wire is what the untyped API sends.
//!
//! The contract:
//!
//! - The arguments are the method value itself, encoded with serde
//!   (`M: Serialize + DeserializeOwned`); the owner decodes them strictly
//!   before the handler runs. Arguments that do not decode are
//!   [`HostError::InvalidArgs`] (`invalid_args` on the wire, not started):
//!   the handler never runs.
//! - A handler returns `Result<M::Out, E>` for any `E` that converts into a
//!   [`BoxError`] (`M::Error` itself, or a [`BoxError`] so `?` works on
//!   storage errors). A fence refusal anywhere in the error's chain is
//!   [`HostError::Fenced`] (nothing of that transaction was written); else
//!   an `M::Error` is the method's own error: [`HostError::Method`] with
//!   its [`AppError::code`], its `Display` text as the message and its
//!   serde encoding as the details — the same variant and fields whether
//!   the call ran here or on another host; anything else is the handler's
//!   failure (`internal_error` across hosts).
//! - A typed call ([`crate::Object::call`]) decodes the details back into
//!   `M::Error` ([`CallError::Method`]); every other failure is
//!   [`CallError::Host`]. A success whose result does not decode as
//!   `M::Out` is [`HostError::RpcResultUnknown`] (the method ran).
//!
//! Design: a marker trait per method rather than a method name and three
//! type parameters at the call, so the class, the result and the error are
//! named once, where the method is declared, and every mismatch is a
//! compile error. Registering a method on another class's builder does not
//! compile:
//!
//! ```compile_fail,E0271
//! # use durability_host::{BoxError, Class, Handle, HostConfig, Method, MethodError};
//! # use serde::{Deserialize, Serialize};
//! # struct Cart;
//! # impl Class for Cart { const NAME: &'static str = "Cart"; }
//! # struct Order;
//! # impl Class for Order { const NAME: &'static str = "Order"; }
//! # #[derive(Serialize, Deserialize)]
//! # struct AddItem { sku: u32 }
//! # impl Method for AddItem {
//! #     type Class = Cart;
//! #     const NAME: &'static str = "add_item";
//! #     type Out = u32;
//! #     type Error = durability_host::typed::NoError;
//! # }
//! fn register<S, I: Send + Sync + 'static>(
//!     config: HostConfig<S, I>,
//! ) -> HostConfig<S, I> {
//!     config
//!         .class_of(|_ctx| Ok::<_, BoxError>(Order))
//!         // AddItem is a Cart method: Order's builder refuses it.
//!         .rpc(|_h: Handle<Order, I>, add: AddItem| async move { Ok::<_, BoxError>(add.sku) })
//!         .done()
//! }
//! ```
//!
//! and neither does calling it on an object of another class, or expecting
//! another result type:
//!
//! ```compile_fail,E0271
//! # use durability_host::{Class, Host, Method};
//! # use serde::{Deserialize, Serialize};
//! # struct Cart;
//! # impl Class for Cart { const NAME: &'static str = "Cart"; }
//! # struct Order;
//! # impl Class for Order { const NAME: &'static str = "Order"; }
//! # #[derive(Serialize, Deserialize)]
//! # struct AddItem { sku: u32 }
//! # impl Method for AddItem {
//! #     type Class = Cart;
//! #     const NAME: &'static str = "add_item";
//! #     type Out = u32;
//! #     type Error = durability_host::typed::NoError;
//! # }
//! async fn call<S, I>(host: &Host<S, I>) -> u32
//! where
//!     S: durability_ownership::LeaseStore + durability_ownership::LifecycleAdmin + Send + Sync + 'static,
//!     I: durability_alarms::AlarmIndex + Send + Sync + 'static,
//! {
//!     // An Order object has no AddItem.
//!     host.object::<Order>("o-1").call(AddItem { sku: 7 }).await.unwrap()
//! }
//! ```
//!
//! ```compile_fail,E0308
//! # use durability_host::{Class, Host, Method};
//! # use serde::{Deserialize, Serialize};
//! # struct Cart;
//! # impl Class for Cart { const NAME: &'static str = "Cart"; }
//! # #[derive(Serialize, Deserialize)]
//! # struct AddItem { sku: u32 }
//! # impl Method for AddItem {
//! #     type Class = Cart;
//! #     const NAME: &'static str = "add_item";
//! #     type Out = u32;
//! #     type Error = durability_host::typed::NoError;
//! # }
//! async fn call<S, I>(host: &Host<S, I>) -> String
//! where
//!     S: durability_ownership::LeaseStore + durability_ownership::LifecycleAdmin + Send + Sync + 'static,
//!     I: durability_alarms::AlarmIndex + Send + Sync + 'static,
//! {
//!     // AddItem returns a u32, not a String.
//!     host.object::<Cart>("c-1").call(AddItem { sku: 7 }).await.unwrap()
//! }
//! ```
//!
//! The same call that compiles (the control for the three above):
//!
//! ```
//! # use durability_host::{Class, Host, Method};
//! # use serde::{Deserialize, Serialize};
//! # struct Cart;
//! # impl Class for Cart { const NAME: &'static str = "Cart"; }
//! # #[derive(Serialize, Deserialize)]
//! # struct AddItem { sku: u32 }
//! # impl Method for AddItem {
//! #     type Class = Cart;
//! #     const NAME: &'static str = "add_item";
//! #     type Out = u32;
//! #     type Error = durability_host::typed::NoError;
//! # }
//! async fn call<S, I>(host: &Host<S, I>) -> u32
//! where
//!     S: durability_ownership::LeaseStore + durability_ownership::LifecycleAdmin + Send + Sync + 'static,
//!     I: durability_alarms::AlarmIndex + Send + Sync + 'static,
//! {
//!     host.object::<Cart>("c-1").call(AddItem { sku: 7 }).await.unwrap()
//! }
//!
//! fn register<S, I: Send + Sync + 'static>(
//!     config: durability_host::HostConfig<S, I>,
//! ) -> durability_host::HostConfig<S, I> {
//!     config
//!         .class_of(|_ctx| Ok::<_, durability_host::BoxError>(Cart))
//!         .rpc(|_h: durability_host::Handle<Cart, I>, add: AddItem| async move {
//!             Ok::<_, durability_host::BoxError>(add.sku)
//!         })
//!         .done()
//! }
//! ```

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{BoxError, HostError, MethodError};
use crate::object::{Class, Handle, MethodInput};

/// A method of class [`Method::Class`], as a type: the value is the
/// call's arguments.
///
/// ```
/// use durability_host::{AppError, Class, Method};
/// use serde::{Deserialize, Serialize};
///
/// struct Cart;
/// impl Class for Cart {
///     const NAME: &'static str = "Cart";
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct AddItem {
///     sku: u32,
/// }
///
/// #[derive(Debug, Serialize, Deserialize, PartialEq)]
/// struct CartView {
///     items: Vec<u32>,
/// }
///
/// #[derive(Debug, Serialize, Deserialize, thiserror::Error)]
/// enum CartError {
///     #[error("sku {0} is out of stock")]
///     OutOfStock(u32),
/// }
///
/// impl AppError for CartError {
///     fn code(&self) -> &str {
///         match self {
///             Self::OutOfStock(_) => "out_of_stock",
///         }
///     }
/// }
///
/// impl Method for AddItem {
///     type Class = Cart;
///     const NAME: &'static str = "add_item";
///     type Out = CartView;
///     type Error = CartError;
/// }
/// assert_eq!(<AddItem as Method>::NAME, "add_item");
/// ```
pub trait Method: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The class whose objects serve it.
    type Class: Class;
    /// The method's name on the wire (the identifier grammar, checked at
    /// [`crate::Host::start`]).
    const NAME: &'static str;
    /// What it returns.
    type Out: Serialize + DeserializeOwned + Send + 'static;
    /// Its own error.
    type Error: AppError;
}

/// A typed method's own error: serde for its details, `Display` for its
/// message, and a stable machine code.
pub trait AppError:
    std::error::Error + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The stable code (`[a-z0-9_]`, 1..=64 bytes; another code is
    /// `internal_error` on the wire).
    fn code(&self) -> &str;
}

/// The error of a method that has none of its own (it cannot be made).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, thiserror::Error)]
pub enum NoError {}

impl AppError for NoError {
    fn code(&self) -> &str {
        match *self {}
    }
}

/// How a typed call fails: the method's own error, decoded, or anything
/// else the host reports.
#[derive(Debug, thiserror::Error)]
pub enum CallError<E> {
    /// The method returned its own error.
    #[error("the method failed: {0}")]
    Method(E),
    /// A refusal, an ownership or transport failure, an unknown outcome, or
    /// a method error whose details do not decode as `E`.
    #[error(transparent)]
    Host(#[from] HostError),
}

impl<E> CallError<E> {
    /// The stable code: `host_method_error` for the method's own error,
    /// else the host error's.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Method(_) => "host_method_error",
            Self::Host(e) => e.code(),
        }
    }

    /// What the failure proves: the method's own error means it ran
    /// ([`durability_ownership::DispatchOutcome::Unknown`] to the host, as
    /// [`HostError::Method`]).
    pub fn outcome(&self) -> durability_ownership::DispatchOutcome {
        match self {
            Self::Method(_) => durability_ownership::DispatchOutcome::Unknown,
            Self::Host(e) => e.outcome(),
        }
    }
}

/// A typed method's error as the host carries it.
fn method_error<E: AppError>(e: &E) -> Result<MethodError, HostError> {
    let details = serde_json::to_value(e).map_err(|err| {
        HostError::Handler(format!("the method's error does not encode: {err}").into())
    })?;
    Ok(MethodError::new(e.code(), e.to_string()).with_details(details))
}

/// Classifies a typed handler's error: a fence refusal in its chain first,
/// then `E` (the method's own error), then as any handler error.
fn classify<E: AppError>(e: BoxError) -> HostError {
    let fenced = HostError::from_handler_chain(&e);
    if let Some(fenced) = fenced {
        return fenced;
    }
    match e.downcast::<E>() {
        Ok(own) => match method_error(own.as_ref()) {
            Ok(m) if MethodError::code_is_valid(&m.code) => HostError::method(m),
            Ok(_) => HostError::Handler(own),
            Err(e) => e,
        },
        Err(other) => HostError::from_handler(other),
    }
}

/// The registered form of a typed handler: decodes the arguments (refused
/// before the handler runs), runs it, encodes its result or error.
pub(crate) fn server<M, I, D, F, Fut, HE>(handler: F) -> crate::rpc::Method<I, D>
where
    M: Method,
    I: Send + Sync + 'static,
    D: Send + Sync + 'static,
    F: Fn(Handle<M::Class, I, D>, M) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M::Out, HE>> + Send + 'static,
    HE: Into<BoxError>,
{
    let handler = Arc::new(handler);
    Arc::new(move |input: MethodInput<I, D>, args: Value| {
        let handler = Arc::clone(&handler);
        Box::pin(async move {
            let args: M = serde_json::from_value(args).map_err(|e| HostError::InvalidArgs {
                reason: format!("the arguments of {} do not decode: {e}", M::NAME),
            })?;
            let handle = input.handle::<M::Class>(<M::Class as Class>::NAME)?;
            let out = handler(handle, args)
                .await
                .map_err(|e| classify::<M::Error>(e.into()))?;
            serde_json::to_value(out).map_err(|e| {
                HostError::Handler(format!("the result of {} does not encode: {e}", M::NAME).into())
            })
        })
    })
}

/// A typed call through `call` (an untyped call by class, name and
/// method: a host's router or a thin client's): the arguments encoded,
/// the answer decoded.
pub(crate) async fn call_with<M, Fut>(
    args: &M,
    call: impl FnOnce(Value) -> Fut,
) -> Result<M::Out, CallError<M::Error>>
where
    M: Method,
    Fut: Future<Output = Result<Value, HostError>>,
{
    let args = encode_args(args)?;
    decode::<M>(call(args).await)
}

/// A typed call's arguments as JSON.
fn encode_args<M: Method>(args: &M) -> Result<Value, HostError> {
    serde_json::to_value(args).map_err(|e| HostError::InvalidArgs {
        reason: format!("the arguments of {} do not encode: {e}", M::NAME),
    })
}

/// A typed call's answer: its result decoded as `M::Out`, its own error as
/// `M::Error`.
pub(crate) fn decode<M: Method>(
    answer: Result<Value, HostError>,
) -> Result<M::Out, CallError<M::Error>> {
    match answer {
        Ok(value) => serde_json::from_value(value).map_err(|e| {
            CallError::Host(HostError::RpcResultUnknown {
                reason: format!("the result of {} does not decode: {e}", M::NAME),
            })
        }),
        Err(HostError::Method {
            code,
            message,
            details: Some(details),
        }) => match serde_json::from_value::<M::Error>(details.clone()) {
            Ok(own) => Err(CallError::Method(own)),
            Err(_) => Err(CallError::Host(HostError::Method {
                code,
                message,
                details: Some(details),
            })),
        },
        Err(e) => Err(CallError::Host(e)),
    }
}

#[cfg(test)]
mod tests;
