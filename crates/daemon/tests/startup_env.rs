//! What the daemon takes from its surroundings at start: the UAPI socket directory
//! (made 0755 whatever the umask; one that others may write to is refused) and
//! wireguard-go's environment (`WG_PROCESS_FOREGROUND=1` keeps it in the foreground;
//! `WG_TUN_FD` and `WG_UAPI_FD`, unsupported, are refused), and where its log goes. Each case runs in a mount
//! namespace of its own with a fresh tmpfs on /run/wireguard, so the machine's
//! directory is never touched, and in a network namespace of its own.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use wirelane_lab::netns::unique;
use wirelane_lab::testbed::*;

const BIN: &str = env!("CARGO_BIN_EXE_wirelane");

/// Runs `script` under `sh` in a new mount namespace in which a fresh tmpfs (mode 0755)
/// is mounted on /run/wireguard (`$DIR`), or on its parent if `parent` (so that the
/// daemon makes the directory), and in network namespace `ns`; `$BIN` is the daemon.
fn in_private_run(ns: &Netns, parent: bool, script: &str) -> Output {
    let dir = std::fs::canonicalize("/var/run/wireguard").unwrap();
    let mount_on = if parent { dir.parent().unwrap() } else { &dir };
    let mount = format!("mount -t tmpfs -o mode=0755 wltest {}", mount_on.display());
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "ip",
            "netns",
            "exec",
            &ns.name,
        ])
        .args(["sh", "-c", &format!("{mount} && {script}")])
        .env("DIR", &dir)
        .env("BIN", BIN)
        .env("LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_socket_directory_is_made_private_and_a_writable_one_refused() {
    require_root();
    let ns = Netns::fresh();
    let name = unique("wd");
    // A umask that would leave it writable to all: the directory is still 0755. The
    // daemon is started in the foreground and stopped once its socket is there.
    let o = in_private_run(
        &ns,
        true,
        &format!(
            "umask 000; \"$BIN\" -f {name} & pid=$!; \
             i=0; while [ ! -S \"$DIR/{name}.sock\" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
             stat -c %a \"$DIR\"; kill $pid; wait $pid"
        ),
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "755", "{o:?}");

    // A directory anyone may write to is refused, with the reason, and nothing made.
    let o = in_private_run(
        &ns,
        false,
        &format!("chmod 777 \"$DIR\"; \"$BIN\" -f {name}; echo rc=$?; ls -A \"$DIR\""),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("rc=1"), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("anyone may write to it"),
        "{o:?}"
    );
    assert_eq!(out.trim(), "rc=1", "something was left: {o:?}");
    assert!(!link_exists(&ns, &name));
    // The machine's own directory was left as it was.
    let mode = std::fs::metadata("/var/run/wireguard")
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o002, 0);
}

#[test]
fn wireguard_gos_environment_is_honoured_or_refused() {
    require_root();
    let ns = Netns::fresh();
    let name = unique("we");
    // WG_PROCESS_FOREGROUND=1: still running in the foreground after a while (without
    // it the command returns once the daemon is ready in the background).
    let o = in_private_run(
        &ns,
        false,
        &format!("WG_PROCESS_FOREGROUND=1 timeout 3 \"$BIN\" {name}; echo rc=$?"),
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("rc=124"),
        "ended before the timeout: {o:?}"
    );
    for var in ["WG_TUN_FD", "WG_UAPI_FD"] {
        let o = in_private_run(
            &ns,
            false,
            &format!("{var}=3 \"$BIN\" -f {name}; echo rc=$?"),
        );
        assert!(String::from_utf8_lossy(&o.stdout).contains("rc=2"), "{o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(var), "{o:?}");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(!link_exists(&ns, &name));
}

/// In the background, `--log-level` keeps the daemon's log on the stderr it was given,
/// as `LOG_LEVEL` does; lines written to anything but a terminal carry no colour codes
/// (the journal would show each as "blob data"). Empty variables count as unset.
#[test]
fn the_log_is_plain_text_and_kept_when_a_level_is_given() {
    require_root();
    let ns = Netns::fresh();
    let name = unique("wl");
    let o = in_private_run(
        &ns,
        false,
        &format!(
            "env -u LOG_LEVEL \"$BIN\" --log-level info {name} 2>\"$DIR/log\" && \
             ip link del {name} && sleep 0.5 && cat \"$DIR/log\""
        ),
    );
    let log = String::from_utf8_lossy(&o.stdout);
    assert!(log.contains("tunnel up"), "{o:?}");
    assert!(!log.contains('\x1b'), "colour codes in {log:?}");
    let o = in_private_run(
        &ns,
        false,
        &format!(
            "env -u LOG_LEVEL WIRELANE_METRICS= WIRELANE_POOL= WIRELANE_LOG= timeout 2 \
             \"$BIN\" -f {name}; echo rc=$?"
        ),
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("rc=124"),
        "{o:?}"
    );
    // An empty filter is no filter: the default level logs, it is not silenced.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("tunnel up"),
        "{o:?}"
    );
}
