//! Helpers for the network-namespace integration tests (run as root).
//!
//! Safety rules these helpers enforce: every namespace and interface name is unique
//! per test process, every namespace is deleted on drop (also when a test panics),
//! every daemon is a child that is terminated and reaped on drop, and traffic only goes
//! to addresses inside the namespaces made here. Every transfer is bounded in size and
//! time.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this process and call: `<prefix><pid%100000>x<n>`.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id() % 100_000)
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "network namespace tests must run as root"
    );
}

/// Finds a tool on PATH (plus the usual per-user install directories).
pub fn tool(name: &str) -> PathBuf {
    wirelane_lab::impls::find_tool(name)
        .unwrap_or_else(|| panic!("'{name}' is not installed: run scripts/install-deps.sh"))
}

pub fn sh(cmd: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh")
}

pub fn sh_ok(cmd: &str) -> String {
    let o = sh(cmd);
    assert!(
        o.status.success(),
        "command failed: {cmd}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Netns {
        let name = unique("wlt");
        sh_ok(&format!(
            "ip netns add {name} && ip -n {name} link set lo up"
        ));
        Netns { name }
    }

    /// Runs a shell command inside the namespace; panics on failure.
    pub fn run(&self, cmd: &str) -> String {
        sh_ok(&format!(
            "ip netns exec {} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    pub fn try_run(&self, cmd: &str) -> Output {
        sh(&format!(
            "ip netns exec {} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    /// Moves the calling thread into this namespace (network only).
    pub fn enter(&self) {
        enter_ns(&self.name);
    }
}

/// Moves the calling thread into the network namespace `name`.
pub fn enter_ns(name: &str) {
    let f = File::open(format!("/var/run/netns/{name}")).expect("netns handle");
    // SAFETY: setns on a valid namespace fd affects only the calling thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns failed: {}", std::io::Error::last_os_error());
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&format!(
            "ip netns pids {0} | xargs -r kill -9; ip netns del {0}",
            self.name
        ));
    }
}

/// Two namespaces joined by a veth pair, with outer addresses of one family.
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
    pub addr_a: IpAddr,
    pub addr_b: IpAddr,
}

impl Pair {
    pub fn new(outer_v6: bool) -> Pair {
        let (a, b) = (Netns::new(), Netns::new());
        let (va, vb) = (unique("va"), unique("vb"));
        sh_ok(&format!(
            "ip link add {va} netns {} type veth peer name {vb} netns {}",
            a.name, b.name
        ));
        let (addr_a, addr_b, plen): (IpAddr, IpAddr, u8) = if outer_v6 {
            (
                "fd00:77::1".parse().unwrap(),
                "fd00:77::2".parse().unwrap(),
                64,
            )
        } else {
            (
                "192.168.77.1".parse().unwrap(),
                "192.168.77.2".parse().unwrap(),
                24,
            )
        };
        for (ns, dev, addr) in [(&a, &va, addr_a), (&b, &vb, addr_b)] {
            sh_ok(&format!(
                "ip -n {n} addr add {addr}/{plen} dev {dev} nodad 2>/dev/null || ip -n {n} addr add {addr}/{plen} dev {dev}; ip -n {n} link set {dev} up",
                n = ns.name
            ));
        }
        Pair {
            a,
            b,
            addr_a,
            addr_b,
        }
    }

    pub fn veth_b(&self) -> String {
        self.b
            .run("ip -o link show type veth | cut -d: -f2 | cut -d@ -f1")
            .trim()
            .to_string()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    Wirelane,
    WireguardGo,
    Boringtun,
}

impl Impl {
    pub fn command(self, ifname: &str) -> Vec<String> {
        match self {
            Impl::Wirelane => vec![
                env!("CARGO_BIN_EXE_wirelane").into(),
                "-f".into(),
                ifname.into(),
            ],
            Impl::WireguardGo => vec![
                tool("wireguard-go").display().to_string(),
                "-f".into(),
                ifname.into(),
            ],
            Impl::Boringtun => vec![
                tool("boringtun-cli").display().to_string(),
                "-f".into(),
                "--disable-drop-privileges".into(),
                ifname.into(),
            ],
        }
    }
}

pub fn socket_path(ifname: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"))
}

/// A daemon running in a namespace in the foreground; terminated and reaped on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub ifname: String,
    pub ns: String,
    pub which: Impl,
}

impl Daemon {
    pub fn start(which: Impl, ns: &Netns) -> Daemon {
        let ifname = unique("wg");
        let cmd = which.command(&ifname);
        let log = File::create(std::env::temp_dir().join(format!("{ifname}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .args(&cmd)
            .env("WG_PROCESS_FOREGROUND", "1")
            .env("LOG_LEVEL", "error")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn daemon");
        let mut d = Daemon {
            child: Some(child),
            ifname,
            ns: ns.name.clone(),
            which,
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if socket_path(&self.ifname).exists() {
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "{:?} exited during start-up: {st}; log: {}",
                    self.which,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{:?} did not create its UAPI socket in time", self.which);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(std::env::temp_dir().join(format!("{}.log", self.ifname)))
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Runs `wg ARGS` against this daemon's interface.
    pub fn wg(&self, args: &str) -> String {
        // Only a whole word is the placeholder: a base64 key may contain "IF".
        let args: Vec<&str> = args
            .split(' ')
            .map(|w| if w == "IF" { self.ifname.as_str() } else { w })
            .collect();
        sh_ok(&format!("ip netns exec {} wg {}", self.ns, args.join(" ")))
    }

    /// Sends SIGTERM and waits up to `timeout` for exit; returns whether it exited.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Peer lines of `wg show IF dump`.
    pub fn dump_peers(&self) -> Vec<PeerDump> {
        self.wg("show IF dump")
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                PeerDump {
                    public_key: f[0].into(),
                    endpoint: f[2].into(),
                    allowed_ips: f[3].into(),
                    latest_handshake: f[4].parse().unwrap_or(0),
                    rx: f[5].parse().unwrap_or(0),
                    tx: f[6].parse().unwrap_or(0),
                }
            })
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
        if self.which != Impl::Wirelane {
            let _ = std::fs::remove_file(socket_path(&self.ifname));
        }
    }
}

#[derive(Debug, Clone)]
pub struct PeerDump {
    pub public_key: String,
    pub endpoint: String,
    pub allowed_ips: String,
    pub latest_handshake: u64,
    pub rx: u64,
    pub tx: u64,
}

pub struct Keys {
    pub private: String,
    pub public: String,
}

pub fn genkeys() -> Keys {
    let private = sh_ok("wg genkey").trim().to_string();
    let public = sh_ok(&format!("echo {private} | wg pubkey"))
        .trim()
        .to_string();
    Keys { private, public }
}

/// Deterministic byte stream for transfers, so the receiver can verify every byte,
/// however the reads split it.
pub struct Stream {
    state: u64,
    word: [u8; 8],
    used: usize,
}

impl Stream {
    pub fn new(seed: u64) -> Self {
        Stream {
            state: seed | 1,
            word: [0; 8],
            used: 8,
        }
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            if self.used == 8 {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.word = self.state.to_le_bytes();
                self.used = 0;
            }
            *b = self.word[self.used];
            self.used += 1;
        }
    }
}

/// Sends `bytes` of a deterministic stream over TCP from namespace `from` to `to_addr`
/// in namespace `to`, and verifies on the receiving side that every byte arrived
/// intact and in order. Bounded by `timeout`.
pub fn tcp_transfer(from: &Netns, to: &Netns, to_addr: IpAddr, bytes: usize, timeout: Duration) {
    let seed = COUNTER.fetch_add(1, Ordering::Relaxed) as u64 * 0x9e37 + 7;
    let (tx, rx) = std::sync::mpsc::channel();
    let to_name = to.name.clone();
    let deadline = Instant::now() + timeout;
    let server = std::thread::spawn(move || -> Result<usize, String> {
        enter_ns(&to_name);
        let l = TcpListener::bind(SocketAddr::new(to_addr, 0)).map_err(|e| e.to_string())?;
        tx.send(l.local_addr().unwrap().port()).unwrap();
        l.set_nonblocking(true).unwrap();
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .unwrap();
        let mut expect = Stream::new(seed);
        let mut got = vec![0u8; 64 * 1024];
        let mut want = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            let n = s
                .read(&mut got)
                .map_err(|e| format!("read after {total} bytes: {e}"))?;
            if n == 0 {
                return Ok(total);
            }
            expect.fill(&mut want[..n]);
            if got[..n] != want[..n] {
                return Err(format!("corrupted data near byte {total}"));
            }
            total += n;
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server did not start");
    let from_name = from.name.clone();
    let client = std::thread::spawn(move || -> Result<(), String> {
        enter_ns(&from_name);
        let addr = SocketAddr::new(to_addr, port);
        let mut s = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => return Err(format!("connect: {e}")),
            }
        };
        s.set_write_timeout(Some(timeout)).unwrap();
        let mut gen = Stream::new(seed);
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let k = left.min(buf.len());
            gen.fill(&mut buf[..k]);
            s.write_all(&buf[..k]).map_err(|e| format!("write: {e}"))?;
            left -= k;
        }
        s.shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())?;
        Ok(())
    });
    client.join().unwrap().expect("sender failed");
    let received = server.join().unwrap().expect("receiver failed");
    assert_eq!(received, bytes, "receiver got a different byte count");
}
