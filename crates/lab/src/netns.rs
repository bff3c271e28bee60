//! Network namespaces the lab creates: uniquely named, and always removed (with every
//! process inside) when their guard drops, whether the run ends, fails or is
//! interrupted.

use crate::Result;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this process and call.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id() % 100_000)
}

/// Runs `sh -c cmd`; Err carries the command and its stderr.
pub fn sh(cmd: &str) -> Result<String> {
    let o = sh_output(cmd)?;
    if !o.status.success() {
        return Err(format!(
            "command failed: {cmd}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

pub fn sh_output(cmd: &str) -> Result<Output> {
    Ok(Command::new("sh").arg("-c").arg(cmd).output()?)
}

pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(prefix: &str) -> Result<Netns> {
        let name = unique(prefix);
        sh(&format!("ip netns add {name}"))?;
        let ns = Netns { name };
        ns.run("ip link set lo up")?;
        Ok(ns)
    }

    /// Runs a shell command inside the namespace.
    pub fn run(&self, cmd: &str) -> Result<String> {
        sh(&format!(
            "ip netns exec {} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    /// Runs a shell command inside the namespace, whatever its outcome.
    pub fn try_run(&self, cmd: &str) -> Result<Output> {
        sh_output(&format!(
            "ip netns exec {} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    /// A command that will run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Moves the calling thread (only) into this namespace.
    pub fn enter(&self) -> Result<()> {
        enter(&self.name)
    }
}

/// Moves the calling thread into the named network namespace.
pub fn enter(name: &str) -> Result<()> {
    let f = File::open(format!("/var/run/netns/{name}"))?;
    // SAFETY: setns with a valid namespace descriptor affects only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {name}: {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&format!(
            "ip netns pids {0} 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del {0} 2>/dev/null",
            self.name
        ));
    }
}
