//! What an object class's code gets: [`ObjectCtx`] when the object is
//! built, [`Handle`] in every call, and the untyped input a registered
//! handler is called with.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;

use durability_alarms::Alarms;
use durability_scheduler::{ObjectId, Scheduler};

use futures::future::BoxFuture;

use crate::error::{BoxError, HostError};
use crate::store::DefaultStorage;

/// Longest object name, in UTF-8 bytes (the seed's id cap). Any other
/// well-formed Unicode name of 1..=512 bytes is valid, control characters
/// included, except NUL (PostgreSQL text cannot hold it); a name with a
/// lone UTF-16 surrogate cannot be a Rust string at all, and the wire
/// refuses one (`invalid_request`).
pub const MAX_OBJECT_NAME_BYTES: usize = 512;

/// Checks an object name against [`MAX_OBJECT_NAME_BYTES`]'s rules.
///
/// # Errors
/// [`HostError::InvalidObjectName`] naming the broken rule.
pub fn validate_object_name(name: &str) -> Result<(), HostError> {
    let reason = if name.is_empty() {
        "the name is empty".to_owned()
    } else if name.len() > MAX_OBJECT_NAME_BYTES {
        format!(
            "the name is {} bytes, more than {MAX_OBJECT_NAME_BYTES}",
            name.len()
        )
    } else if name.contains('\0') {
        "the name contains NUL".to_owned()
    } else {
        return Ok(());
    };
    Err(HostError::InvalidObjectName { reason })
}

/// An object class as a type: the type knows its class name, so a caller
/// names the class once, by type (`host.object::<Cart>("cart-42")`), and
/// a handler registered on [`crate::HostConfig::class_of`]'s builder gets a
/// [`Handle`] of exactly that type. The name is what crosses the wire
/// (object ids, owner scopes, invokes), so renaming a class is a storage
/// change.
///
/// ```
/// use durability_host::Class;
///
/// struct Cart;
///
/// impl Class for Cart {
///     const NAME: &'static str = "Cart";
/// }
/// assert_eq!(Cart::NAME, "Cart");
/// ```
pub trait Class: Send + Sync + 'static {
    /// The class name (the object-class grammar of the ownership crate).
    const NAME: &'static str;
}

/// What an object's factory gets: the object's identity, its scheduler
/// (storage, one alarm, clock) and its alarms.
pub struct ObjectCtx<I, D = DefaultStorage> {
    /// The object's class.
    pub class: String,
    /// The object's name within its class.
    pub name: String,
    /// The object id (`<storage id>:<class>:<name>`).
    pub id: ObjectId,
    /// The object's scheduler; its storage is fenced at the scope's claim.
    pub scheduler: Scheduler<D>,
    /// The object's alarm (backed by the host's alarm index).
    pub alarms: Alarms<D, I>,
    /// The generation of the claim the object was opened under.
    pub generation: u64,
}

impl<I, D> std::fmt::Debug for ObjectCtx<I, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCtx")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// An object as its class's factory built it (type-erased).
pub(crate) type Instance = Arc<dyn Any + Send + Sync>;

/// An open object, as a call body gets it.
pub struct Handle<T, I, D = DefaultStorage> {
    /// The object (what its class's factory built).
    pub object: Arc<T>,
    /// Its scheduler (storage, one alarm, clock); transactions commit
    /// through the storage fence.
    pub scheduler: Scheduler<D>,
    /// Its alarm.
    pub alarms: Alarms<D, I>,
    /// The generation the call runs under.
    pub generation: u64,
}

impl<T, I, D: durability_scheduler::Storage> std::fmt::Debug for Handle<T, I, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("scheduler", &self.scheduler)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// A handler of the objects of class `T` (a method, a fetch, an alarm):
/// it gets the object's [`Handle`] and its argument `A` and answers `R`
/// or an error. Implemented for every such function or closure.
pub trait Handler<T, I, D, A, R>:
    Fn(Handle<T, I, D>, A) -> Self::Future + Send + Sync + 'static
{
    /// What it returns.
    type Future: Future<Output = Result<R, BoxError>> + Send + 'static;
}

impl<T, I, D, A, R, F, Fut> Handler<T, I, D, A, R> for F
where
    F: Fn(Handle<T, I, D>, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, BoxError>> + Send + 'static,
{
    type Future = Fut;
}

/// A handler registered with a type, type-erased: it gets the object's
/// input and its argument.
pub(crate) type Erased<I, D, A, R> =
    Arc<dyn Fn(MethodInput<I, D>, A) -> BoxFuture<'static, Result<R, BoxError>> + Send + Sync>;

/// `handler` over the typed [`Handle`] of class `class`'s objects,
/// type-erased: the one place a registered handler (method, fetch,
/// connect, alarm) gets its handle ([`HostError::ClassType`], boxed, when
/// the object is of another type).
pub(crate) fn erase<T, I, D, A, R, F>(class: &str, handler: F) -> Erased<I, D, A, R>
where
    T: Send + Sync + 'static,
    I: Send + Sync + 'static,
    D: Send + Sync + 'static,
    A: Send + 'static,
    R: 'static,
    F: Handler<T, I, D, A, R>,
{
    let handler = Arc::new(handler);
    let class = class.to_owned();
    Arc::new(move |input: MethodInput<I, D>, args| {
        let handler = Arc::clone(&handler);
        let class = class.clone();
        Box::pin(async move {
            let handle = input.handle::<T>(&class)?;
            handler(handle, args).await
        })
    })
}

/// The object `instance` of `class` as a `T`.
///
/// # Errors
/// [`HostError::ClassType`] when it is not a `T`.
pub(crate) fn downcast<T: Send + Sync + 'static>(
    instance: &Instance,
    class: &str,
) -> Result<Arc<T>, HostError> {
    Arc::clone(instance)
        .downcast::<T>()
        .map_err(|_| HostError::ClassType {
            class: class.to_owned(),
        })
}

/// What a registered method gets besides its arguments.
pub(crate) struct MethodInput<I, D> {
    pub(crate) instance: Instance,
    pub(crate) scheduler: Scheduler<D>,
    pub(crate) alarms: Alarms<D, I>,
    pub(crate) generation: u64,
}

impl<I, D> MethodInput<I, D> {
    /// The typed handle of an object of `class`.
    ///
    /// # Errors
    /// [`HostError::ClassType`] when the object is not a `T`.
    pub(crate) fn handle<T: Send + Sync + 'static>(
        self,
        class: &str,
    ) -> Result<Handle<T, I, D>, HostError> {
        Ok(Handle {
            object: downcast(&self.instance, class)?,
            scheduler: self.scheduler,
            alarms: self.alarms,
            generation: self.generation,
        })
    }
}
