//! What the io crate's namespace tests share.

use std::process::Command;

/// Runs `ip ARGS` in the calling thread's network namespace (a test thread that
/// unshared one), failing the test if it fails.
pub fn ip_here(args: &str) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // Not /proc/self: that would be nsenter's own.
    let ns = format!("/proc/{}/task/{tid}/ns/net", std::process::id());
    let st = Command::new("nsenter")
        .arg(format!("--net={ns}"))
        .arg("ip")
        .args(args.split_whitespace())
        .status()
        .expect("nsenter runs");
    assert!(st.success(), "ip {args}");
}
