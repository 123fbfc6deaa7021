//! Failure state shared by everything distributed in one process: the heartbeat thread, store
//! calls and NCCL communicators record the first failure here; the training loop polls
//! [`Health::check`] once per step; abort hooks (NCCL `ncclCommAbort`) run as soon as a failure is
//! recorded so collectives blocked on a dead peer return; and, when configured, the process exits
//! with a clear message after a grace period so that a rank blocked inside a call that cannot be
//! interrupted never hangs silently. The exit timer starts before the hooks run, so a hook that
//! blocks cannot stop it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{DistError, Result};

/// Exit code used when a rank exits because the group failed (distinct from crashes and from 1).
pub const PEER_FAILURE_EXIT_CODE: i32 = 3;

type Hook = Box<dyn Fn() + Send + Sync>;

/// What happens when the exit grace of a failure has passed: by default print the reason and
/// exit with [`PEER_FAILURE_EXIT_CODE`] (tests substitute a probe).
type Expiry = Arc<dyn Fn(&str) + Send + Sync>;

/// The failure and the hooks still to run, under one lock: a hook registered concurrently with
/// [`Health::record`] is either taken (and run) by `record` or sees the failure and runs at once,
/// never neither.
#[derive(Default)]
struct State {
    failure: Option<String>,
    hooks: Vec<Hook>,
}

/// The process's view of the group's health.
pub struct Health {
    rank: usize,
    state: Mutex<State>,
    exit_grace: Option<Duration>,
    expiry: Expiry,
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
        Self::with_expiry(
            rank,
            exit_grace,
            Arc::new(move |reason: &str| {
                eprintln!(
                    "flamia-dist: rank {rank}: process group failed: {reason}; exiting with code \
                     {PEER_FAILURE_EXIT_CODE} (grace period {exit_grace:?} passed)"
                );
                std::process::exit(PEER_FAILURE_EXIT_CODE);
            }),
        )
    }

    /// As [`Health::new`], with `expiry` run (on the exit timer's thread, with the failure
    /// reason) instead of exiting the process once the grace has passed.
    pub(crate) fn with_expiry(rank: usize, exit_grace: Option<Duration>, expiry: Expiry) -> Arc<Self> {
        Arc::new(Health {
            rank,
            state: Mutex::new(State::default()),
            exit_grace,
            expiry,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        self.lock().failure.clone()
    }

    /// Run `hook` when the group fails (immediately, on this thread, if it already has). Used to
    /// abort NCCL communicators so that blocked collectives return.
    pub fn on_failure(&self, hook: impl Fn() + Send + Sync + 'static) {
        let mut st = self.lock();
        if st.failure.is_none() {
            // `record` takes the hooks under this same lock after setting the failure, so it will
            // find and run this one.
            st.hooks.push(Box::new(hook));
            return;
        }
        drop(st);
        hook();
    }

    /// Record a failure. The first one wins: the exit timer starts, then the hooks run (on this
    /// thread); later calls only return false. The timer starts first so that a hook that blocks
    /// (an abort stuck behind a hung call) cannot keep the process from exiting.
    pub fn record(self: &Arc<Self>, reason: impl Into<String>) -> bool {
        let reason = reason.into();
        let hooks = {
            let mut st = self.lock();
            if st.failure.is_some() {
                return false;
            }
            st.failure = Some(reason.clone());
            std::mem::take(&mut st.hooks)
        };
        if let Some(grace) = self.exit_grace {
            let expiry = self.expiry.clone();
            let spawned = std::thread::Builder::new()
                .name("flamia-dist-exit".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    expiry(&reason);
                });
            if let Err(e) = spawned {
                eprintln!(
                    "flamia-dist: rank {}: cannot start the exit timer ({e}); a hung call will not \
                     end this process",
                    self.rank
                );
            }
        }
        for h in hooks {
            h();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

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

    /// Registers a hook that signals when it runs and then blocks until released (at most 20 s,
    /// so a failing run still ends): (entered, release).
    fn blocking_hook(h: &Arc<Health>) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let entered_tx = Mutex::new(entered_tx);
        h.on_failure(move || {
            let _ = entered_tx.lock().unwrap().send(());
            let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
        });
        (entered_rx, release_tx)
    }

    /// A hook that blocks (an abort waiting on a hung call) must not keep the exit timer from
    /// starting: the expiry fires while the hook is still blocked.
    #[test]
    fn exit_timer_starts_before_a_blocking_hook() {
        let (expired_tx, expired_rx) = mpsc::channel::<String>();
        let expired_tx = Mutex::new(expired_tx);
        let h = Health::with_expiry(
            2,
            Some(Duration::from_millis(50)),
            Arc::new(move |reason: &str| {
                let _ = expired_tx.lock().unwrap().send(reason.to_string());
            }),
        );
        let (entered_rx, release_tx) = blocking_hook(&h);
        let h2 = h.clone();
        let recorder = std::thread::spawn(move || h2.record("rank 1 stopped heartbeating"));
        entered_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the hook runs");
        let expired = expired_rx.recv_timeout(Duration::from_secs(5));
        release_tx.send(()).unwrap();
        assert!(recorder.join().unwrap());
        assert_eq!(
            expired.expect("the exit timer fires while the hook is still blocked"),
            "rank 1 stopped heartbeating"
        );
    }

    /// A hook registered while another thread records the failure runs exactly once: never lost
    /// (registered after `record` took the hooks but having seen no failure) and never twice.
    /// Two threads in lock step race `record` against `on_failure` on many fresh states.
    #[test]
    fn a_hook_registered_during_record_runs_exactly_once() {
        const ROUNDS: usize = 20_000;
        let states: Arc<Vec<Arc<Health>>> = Arc::new((0..ROUNDS).map(|_| Health::new(0, None)).collect());
        let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
        // Round i starts when both threads have announced it (spinning: closer than a Barrier).
        let ready = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let step = |me: usize, ready: &[AtomicUsize; 2], i: usize| {
            ready[me].store(i + 1, Ordering::SeqCst);
            let mut spins = 0u32;
            while ready[1 - me].load(Ordering::SeqCst) < i + 1 {
                spins += 1;
                if spins < 1000 {
                    std::hint::spin_loop();
                } else {
                    // The other thread is not running (2 busy cores): let it.
                    std::thread::yield_now();
                }
            }
        };
        let (s2, r2) = (states.clone(), ready.clone());
        let recorder = std::thread::spawn(move || {
            for i in 0..ROUNDS {
                step(0, &r2, i);
                s2[i].record("failed");
            }
        });
        for i in 0..ROUNDS {
            step(1, &ready, i);
            let counts = counts.clone();
            states[i].on_failure(move || {
                counts[i].fetch_add(1, Ordering::SeqCst);
            });
        }
        recorder.join().unwrap();
        let wrong: Vec<(usize, usize)> = (0..ROUNDS)
            .map(|i| (i, counts[i].load(Ordering::SeqCst)))
            .filter(|&(_, n)| n != 1)
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {ROUNDS} hooks did not run exactly once (round, runs): {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(10)]
        );
    }

    /// Hooks registered while a hook of `record` is still running (blocked) run too.
    #[test]
    fn a_hook_registered_while_a_hook_blocks_runs() {
        let h = Health::new(0, None);
        let (entered_rx, release_tx) = blocking_hook(&h);
        let h2 = h.clone();
        let recorder = std::thread::spawn(move || h2.record("failed"));
        entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let ran2 = ran.clone();
        h.on_failure(move || {
            ran2.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "runs at once, not after the blocked hook"
        );
        release_tx.send(()).unwrap();
        recorder.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
