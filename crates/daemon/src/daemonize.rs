//! Running in the background the way wg-quick expects: `wirelane IFNAME` returns only
//! once the interface and its UAPI socket exist, leaving the daemon running.
//!
//! The parent re-executes itself in the foreground as a new session leader, with the
//! write end of a pipe as fd 3 (named by WIRELANE_READY_FD). The child writes "ok" once
//! it serves, or "error: ..." if set-up fails; the parent relays that and exits. No
//! fork happens in a multi-threaded process.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

pub const READY_FD_ENV: &str = "WIRELANE_READY_FD";
const CHILD_READY_FD: RawFd = 3;

/// Starts the background daemon and waits for its verdict. Returns the exit code.
pub fn spawn_background(args: &[String], keep_stderr: bool) -> io::Result<i32> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-element array; result checked.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new descriptors that we now own.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let write_raw = write_end.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--foreground")
        .args(args)
        .env(READY_FD_ENV, CHILD_READY_FD.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if !keep_stderr {
        cmd.stderr(Stdio::null());
    }
    // SAFETY: runs in the child between fork and exec and calls only async-signal-safe
    // functions (setsid, dup2), touching no allocator or lock.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::dup2(write_raw, CHILD_READY_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(write_end);
    let mut verdict = String::new();
    std::fs::File::from(read_end).read_to_string(&mut verdict)?;
    if verdict.starts_with("ok") {
        // The daemon lives on, detached; we do not wait for it.
        drop(child);
        return Ok(0);
    }
    let msg = verdict.trim();
    if msg.is_empty() {
        eprintln!("wirelane: the background daemon exited during set-up");
    } else {
        eprintln!("wirelane: {}", msg.trim_start_matches("error: "));
    }
    Ok(1)
}

/// Whether `fd` is an open pipe (FIFO) and not a standard stream.
fn is_pipe(fd: RawFd) -> bool {
    if fd <= 2 {
        return false;
    }
    // SAFETY: fstat writes into the zeroed stat it is given; an invalid fd fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) }) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
}

/// The child's side of the readiness pipe, if it was started by [`spawn_background`].
pub struct Readiness(Option<std::fs::File>);

impl Readiness {
    /// The pipe named by the environment, if it names one. Anything else there (a
    /// closed descriptor, a file, a standard stream) is ignored with a warning: taken
    /// as ours, a number later reused would have been written to and closed under its
    /// real owner.
    pub fn from_env() -> Readiness {
        let named = std::env::var(READY_FD_ENV).ok();
        std::env::remove_var(READY_FD_ENV);
        let Some(named) = named else {
            return Readiness(None);
        };
        match named.parse::<RawFd>().ok().filter(|&fd| is_pipe(fd)) {
            // SAFETY: an open pipe past the standard streams, which the parent placed
            // there for us (nothing else in this process has opened it yet).
            Some(fd) => Readiness(Some(unsafe { std::fs::File::from_raw_fd(fd) })),
            None => {
                eprintln!("wirelane: ignoring {READY_FD_ENV}={named:?}: not an open pipe");
                Readiness(None)
            }
        }
    }

    pub fn ready(&mut self) {
        if let Some(mut f) = self.0.take() {
            let _ = f.write_all(b"ok\n");
        }
    }

    pub fn failed(&mut self, why: &str) {
        if let Some(mut f) = self.0.take() {
            let _ = writeln!(f, "error: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn only_an_open_pipe_is_taken_as_the_readiness_pipe() {
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(!is_pipe(file.as_raw_fd()), "a regular file");
        assert!(!is_pipe(1), "a standard stream");
        assert!(!is_pipe(999_999), "a descriptor not open");
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors; wrapped at once.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both were just created and are ours.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        assert!(is_pipe(w.as_raw_fd()));
        drop((r, w));
    }
}
