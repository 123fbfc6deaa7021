//! Failure state shared by everything distributed in one process: the heartbeat thread, store
//! calls and NCCL communicators record the first failure here; the training loop polls
//! [`Health::check`] once per step; abort hooks (NCCL `ncclCommAbort`) run as soon as a failure is
//! recorded so collectives blocked on a dead peer return; and, when configured, the process exits
//! with a clear message after a grace period so that a rank blocked inside a call that cannot be
//! interrupted never hangs silently.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{DistError, Result};

/// Exit code used when a rank exits because the group failed (distinct from crashes and from 1).
pub const PEER_FAILURE_EXIT_CODE: i32 = 3;

type Hook = Box<dyn Fn() + Send + Sync>;

/// The process's view of the group's health.
pub struct Health {
    rank: usize,
    failure: Mutex<Option<String>>,
    hooks: Mutex<Vec<Hook>>,
    exit_grace: Option<Duration>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("rank", &self.rank)
            .field("failure", &self.failure())
            .finish()
    }
}

impl Health {
    /// New healthy state. With `exit_grace = Some(g)`, a recorded failure ends the process with
    /// [`PEER_FAILURE_EXIT_CODE`] after `g` unless it has exited by itself before.
    pub fn new(rank: usize, exit_grace: Option<Duration>) -> Arc<Self> {
        Arc::new(Health {
            rank,
            failure: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
            exit_grace,
        })
    }

    /// `Err(PeerFailure)` once the group has failed.
    pub fn check(&self) -> Result<()> {
        match self.failure() {
            Some(msg) => Err(DistError::PeerFailure(msg)),
            None => Ok(()),
        }
    }

    /// The first recorded failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Run `hook` when the group fails (immediately if it already has). Used to abort NCCL
    /// communicators so that blocked collectives return.
    pub fn on_failure(&self, hook: impl Fn() + Send + Sync + 'static) {
        if self.failure().is_some() {
            hook();
            return;
        }
        self.hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(hook));
    }

    /// Record a failure. The first one wins: hooks run and the exit timer starts; later calls only
    /// return false.
    pub fn record(self: &Arc<Self>, reason: impl Into<String>) -> bool {
        let reason = reason.into();
        {
            let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_some() {
                return false;
            }
            *f = Some(reason.clone());
        }
        let hooks = std::mem::take(&mut *self.hooks.lock().unwrap_or_else(|p| p.into_inner()));
        for h in hooks {
            h();
        }
        if let Some(grace) = self.exit_grace {
            let rank = self.rank;
            let _ = std::thread::Builder::new()
                .name("flamia-dist-exit".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    eprintln!(
                        "flamia-dist: rank {rank}: process group failed: {reason}; exiting with code \
                     {PEER_FAILURE_EXIT_CODE} (grace period {grace:?} passed)"
                    );
                    std::process::exit(PEER_FAILURE_EXIT_CODE);
                });
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn first_failure_wins_and_hooks_run_once() {
        let h = Health::new(0, None);
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        h.on_failure(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        });
        assert!(h.check().is_ok());
        assert!(h.record("rank 3 died"));
        assert!(!h.record("second"));
        assert_eq!(n.load(Ordering::SeqCst), 1);
        let e = h.check().unwrap_err();
        assert!(e.to_string().contains("rank 3 died"), "{e}");
        let n3 = n.clone();
        h.on_failure(move || {
            n3.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(
            n.load(Ordering::SeqCst),
            11,
            "hooks added after a failure run at once"
        );
    }
}
