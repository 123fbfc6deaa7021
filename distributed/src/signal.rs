//! "Stop soon" requests from the scheduler. Slurm sends SIGTERM on preemption, `scancel` and at
//! the time limit (followed by SIGKILL after its `KillWait`/`GraceTime`), and SIGUSR1 ahead of
//! the time limit when the job asked for it (`#SBATCH --signal=B:USR1@300`, forwarded to the
//! tasks by `launch/slurm.sbatch`). [`install`] replaces the default action of those signals
//! (death) by setting a flag; the training loop polls [`requested`] once per step, agrees with
//! the other ranks to stop at the same step (one rank seeing the signal is enough), writes a
//! checkpoint and exits with [`PREEMPTED_EXIT_CODE`], which `launch/slurm.sbatch` turns into a
//! requeue.
//!
//! The handler only stores the signal number in an atomic (async-signal-safe); nothing else runs
//! in signal context.

use std::sync::atomic::{AtomicI32, Ordering};

use crate::error::{DistError, Result};

/// Exit status of a rank that stopped on a signal after its checkpoint was written: 75 is
/// `EX_TEMPFAIL` of sysexits.h ("temporary failure, retry later"). `launch/slurm.sbatch` requeues
/// the job when the step ends with it; a cluster may instead list it in slurm.conf's
/// `RequeueExit`.
pub const PREEMPTED_EXIT_CODE: i32 = 75;

/// The signals treated as "checkpoint and stop": SIGTERM and SIGUSR1.
pub const STOP_SIGNALS: [i32; 2] = [libc::SIGTERM, libc::SIGUSR1];

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // First signal wins; later ones (srun and Slurm may both deliver one) change nothing.
    let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Catch `signals` (usually [`STOP_SIGNALS`]) for the rest of the process's life: each sets the
/// flag [`requested`] reads instead of ending the process. Interrupted system calls restart.
pub fn install(signals: &[i32]) -> Result<()> {
    for &sig in signals {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler is an `extern "C"`
        // function that only touches an atomic; `sigemptyset` initialises the mask in place.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(DistError::BadTopology(format!(
                "cannot install a handler for signal {sig}: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// The first stop signal received since [`install`] (its number), if any.
pub fn requested() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// `SIGTERM`, `SIGUSR1`, or the number, for messages.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        libc::SIGINT => "SIGINT".into(),
        s => format!("signal {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_signal_sets_the_flag_instead_of_killing_the_process() {
        install(&[libc::SIGUSR2]).unwrap();
        assert_eq!(requested(), None);
        // SAFETY: raising a signal whose handler was installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR2) }, 0);
        assert_eq!(requested(), Some(libc::SIGUSR2));
        assert_eq!(name(libc::SIGUSR2), "SIGUSR2");
    }
}
