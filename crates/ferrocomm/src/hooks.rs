//! Hooks (torchcomms' `register_pre_hook`, `register_post_hook`, `register_abort_hook`):
//! functions a caller registers on a communicator, called before every call, after every call,
//! and once when the communicator is aborted (by `abort()`, or by its watcher when a peer
//! died or gave up). A call with no hook registered pays one relaxed load.
//!
//! Pre- and post-hooks receive the call's op id (one numbering for the whole process, shared
//! with the flight recorder), so that they can be paired. A hook runs on the calling thread
//! (an abort hook on the thread that aborts: possibly the watcher's) and may register or remove
//! hooks itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use crate::backend::{CallKind, CallOpts};
use crate::error::{Error, Result};

/// What a pre-hook sees: the call about to run.
pub struct PreHookArgs<'a> {
    /// The call's op id (the post-hook gets the same).
    pub op_id: u64,
    /// The call's name (`all_reduce`, ..., `all_reduce_rmsnorm`).
    pub name: &'static str,
    /// The call and its operands.
    pub call: &'a CallKind<'a>,
    /// The call's options.
    pub opts: &'a CallOpts,
}

/// What a post-hook sees: the call that returned.
pub struct PostHookArgs<'a> {
    /// The call's op id.
    pub op_id: u64,
    /// The call's name.
    pub name: &'static str,
    /// How it returned (a CUDA call has been enqueued, not necessarily finished).
    pub result: &'a Result<()>,
}

/// A pre-hook.
pub type PreHook = dyn Fn(&PreHookArgs<'_>) + Send + Sync;
/// A post-hook.
pub type PostHook = dyn Fn(&PostHookArgs<'_>) + Send + Sync;
/// An abort hook.
pub type AbortHook = dyn Fn() + Send + Sync;

#[derive(Default)]
struct Lists {
    pre: Vec<(u64, Arc<PreHook>)>,
    post: Vec<(u64, Arc<PostHook>)>,
    abort: Vec<(u64, Arc<AbortHook>)>,
}

/// The hooks of one communicator.
#[derive(Default)]
pub struct Hooks {
    /// Whether any pre- or post-hook is registered (the one load a call pays).
    any: AtomicBool,
    next: AtomicU64,
    lists: RwLock<Lists>,
    aborted: AtomicBool,
}

/// Removes the hook it was returned for (torchcomms' `RemovableHandle`); dropping it keeps
/// the hook.
pub struct HookHandle {
    hooks: Weak<Hooks>,
    id: u64,
}

impl HookHandle {
    /// Unregisters the hook (nothing when it or its communicator is gone already).
    pub fn remove(&self) {
        if let Some(h) = self.hooks.upgrade() {
            let mut l = h.lists.write().unwrap_or_else(|e| e.into_inner());
            l.pre.retain(|(i, _)| *i != self.id);
            l.post.retain(|(i, _)| *i != self.id);
            l.abort.retain(|(i, _)| *i != self.id);
            h.any
                .store(!l.pre.is_empty() || !l.post.is_empty(), Ordering::Release);
        }
    }
}

impl Hooks {
    fn add(self: &Arc<Self>, f: impl FnOnce(&mut Lists, u64)) -> HookHandle {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut l = self.lists.write().unwrap_or_else(|e| e.into_inner());
        f(&mut l, id);
        self.any
            .store(!l.pre.is_empty() || !l.post.is_empty(), Ordering::Release);
        HookHandle {
            hooks: Arc::downgrade(self),
            id,
        }
    }

    /// Registers a pre-hook.
    pub fn register_pre(self: &Arc<Self>, f: Arc<PreHook>) -> HookHandle {
        self.add(|l, id| l.pre.push((id, f)))
    }

    /// Registers a post-hook.
    pub fn register_post(self: &Arc<Self>, f: Arc<PostHook>) -> HookHandle {
        self.add(|l, id| l.post.push((id, f)))
    }

    /// Registers an abort hook; refused once the communicator has been aborted (it would
    /// never run).
    pub fn register_abort(self: &Arc<Self>, f: Arc<AbortHook>) -> Result<HookHandle> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(
                "register_abort_hook: the communicator has been aborted already".into(),
            ));
        }
        Ok(self.add(|l, id| l.abort.push((id, f))))
    }

    /// Whether any pre- or post-hook is registered.
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Calls every pre-hook (in registration order).
    pub fn pre(&self, args: &PreHookArgs<'_>) {
        let hooks: Vec<Arc<PreHook>> = {
            let l = self.lists.read().unwrap_or_else(|e| e.into_inner());
            l.pre.iter().map(|(_, f)| f.clone()).collect()
        };
        for h in hooks {
            h(args);
        }
    }

    /// Calls every post-hook.
    pub fn post(&self, args: &PostHookArgs<'_>) {
        let hooks: Vec<Arc<PostHook>> = {
            let l = self.lists.read().unwrap_or_else(|e| e.into_inner());
            l.post.iter().map(|(_, f)| f.clone()).collect()
        };
        for h in hooks {
            h(args);
        }
    }

    /// Calls every abort hook, the first time only.
    pub fn abort(&self) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        let hooks: Vec<Arc<AbortHook>> = {
            let l = self.lists.read().unwrap_or_else(|e| e.into_inner());
            l.abort.iter().map(|(_, f)| f.clone()).collect()
        };
        for h in hooks {
            h();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn hooks_run_in_order_until_removed_and_abort_hooks_once() {
        let h = Arc::new(Hooks::default());
        assert!(!h.any());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s1 = seen.clone();
        let a = h.register_pre(Arc::new(move |a: &PreHookArgs<'_>| {
            s1.lock()
                .unwrap()
                .push(format!("pre1 {} {}", a.op_id, a.name))
        }));
        let s2 = seen.clone();
        let _b = h.register_post(Arc::new(move |a: &PostHookArgs<'_>| {
            s2.lock()
                .unwrap()
                .push(format!("post {} {}", a.op_id, a.result.is_ok()))
        }));
        let s3 = seen.clone();
        let _c = h
            .register_abort(Arc::new(move || s3.lock().unwrap().push("abort".into())))
            .unwrap();
        assert!(h.any());
        let o = CallOpts::default();
        h.pre(&PreHookArgs {
            op_id: 7,
            name: "barrier",
            call: &CallKind::Barrier,
            opts: &o,
        });
        h.post(&PostHookArgs {
            op_id: 7,
            name: "barrier",
            result: &Ok(()),
        });
        a.remove();
        h.pre(&PreHookArgs {
            op_id: 8,
            name: "barrier",
            call: &CallKind::Barrier,
            opts: &o,
        });
        h.abort();
        h.abort();
        assert_eq!(
            *seen.lock().unwrap(),
            ["pre1 7 barrier", "post 7 true", "abort"]
        );
        assert!(h.register_abort(Arc::new(|| ())).is_err());
    }
}
