//! Ctrl-C and SIGTERM for the lab's long commands. The first signal asks the command to
//! stop: its loops check [`check`] between runs and return an error, so the guards of
//! what they made (namespaces, daemons) drop and clean up. A second signal ends the
//! process at once, as the user then asks, cleanup or not.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if REQUESTED.swap(true, Ordering::SeqCst) {
        // SAFETY: signal and raise are async-signal-safe; the default action ends us.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    // SAFETY: the handler only touches an atomic and async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// The flag itself, for loops that take one.
pub fn flag() -> &'static AtomicBool {
    &REQUESTED
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// An error once a stop was asked for: what a loop returns between its runs.
pub fn check() -> crate::Result<()> {
    if requested() {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}
