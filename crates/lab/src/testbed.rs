//! The namespace testbed as the tests use it: the lab's own namespaces, veth pairs and
//! daemon starter, with panicking helpers (a failed step is a failed test), shared
//! keys and a verified TCP transfer. The daemon's integration tests and the lab's use
//! this one testbed.
//!
//! Safety rules it keeps: every namespace and interface name is unique per process and
//! call, every namespace is deleted on drop (also when a test panics), every daemon is
//! a child that is terminated and reaped on drop, and traffic goes only to addresses
//! inside the namespaces made here. Every transfer is bounded in size and time.

pub use crate::impls::{find_tool, Daemon, Flavor, Impl, WIRELANE};
pub use crate::netns::{unique, Netns};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::fq_codel::QueueDiscipline;

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "network namespace tests must run as root"
    );
}

/// Finds a tool (see `find_tool`), or fails the test saying how to install it.
pub fn tool(name: &str) -> PathBuf {
    find_tool(name)
        .unwrap_or_else(|| panic!("'{name}' is not installed: run scripts/install-deps.sh"))
}

/// Runs `sh -c cmd` and returns its output; fails the test if it fails.
pub fn sh_ok(cmd: &str) -> String {
    crate::netns::sh(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// wirelane under each execution model, for tests that must hold under every one.
pub fn wirelane_models() -> [Impl; 3] {
    Model::ALL.map(|m| {
        Impl::Wirelane(Flavor {
            model: Some(m),
            ..Flavor::default()
        })
    })
}

/// Every execution model with the default queue discipline, then the default model
/// with `--queue fifo`: the settings interoperability must hold under.
pub fn wirelane_settings() -> Vec<Impl> {
    let mut all = wirelane_models().to_vec();
    all.push(Impl::Wirelane(Flavor {
        queue: Some(QueueDiscipline::Fifo),
        ..Flavor::default()
    }));
    all
}

pub fn socket_path(ifname: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"))
}

/// Moves the calling thread into the namespace `name`; fails the test if it cannot.
pub fn enter_ns(name: &str) {
    crate::netns::enter(name).unwrap_or_else(|e| panic!("{e}"));
}

impl Netns {
    /// A new namespace for a test.
    pub fn fresh() -> Netns {
        Netns::new("wlt").unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs a shell command inside the namespace; fails the test if it fails.
    pub fn run_ok(&self, cmd: &str) -> String {
        self.run(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs a shell command inside the namespace, whatever its outcome.
    pub fn try_run_ok(&self, cmd: &str) -> std::process::Output {
        self.try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
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
        let (a, b) = (Netns::fresh(), Netns::fresh());
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
        crate::topology::veth(
            &a,
            &format!("{addr_a}/{plen}"),
            &b,
            &format!("{addr_b}/{plen}"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Pair {
            a,
            b,
            addr_a,
            addr_b,
        }
    }

    /// The name of host B's end of the veth pair.
    pub fn veth_b(&self) -> String {
        self.b
            .run_ok("ip -o link show type veth | cut -d: -f2 | cut -d@ -f1")
            .trim()
            .to_string()
    }
}

impl Daemon {
    /// Starts `which` in the foreground in `ns`; fails the test if it cannot.
    pub fn start(which: Impl, ns: &Netns) -> Daemon {
        crate::impls::start(which, ns).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn pid(&self) -> u32 {
        self.pid.expect("a daemon process")
    }

    /// Runs `wg ARGS` against this daemon's interface, in its namespace; `IF` (as a
    /// whole word: a base64 key may contain the letters) stands for the interface.
    pub fn wg(&self, args: &str) -> String {
        let args: Vec<&str> = args
            .split(' ')
            .map(|w| if w == "IF" { self.ifname.as_str() } else { w })
            .collect();
        sh_ok(&format!("ip netns exec {} wg {}", self.ns, args.join(" ")))
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

/// Tunnel `i` between `a` (in namespace A, which starts the handshake) and `b`:
/// inner addresses 10.80.i.1 and 10.80.i.2, ports 52000+i and 52100+i.
pub fn configure_tunnel(pair: &Pair, a: &Daemon, b: &Daemon, i: u8) -> IpAddr {
    let (ka, kb) = (genkeys(), genkeys());
    let dir = std::env::temp_dir();
    let (pa, pb) = (52000 + i as u16, 52100 + i as u16);
    for (d, me, other, port, peer) in [
        (
            a,
            &ka,
            &kb,
            pa,
            format!(
                "AllowedIPs = 10.80.{i}.2/32\nEndpoint = {}:{pb}\n",
                pair.addr_b
            ),
        ),
        (b, &kb, &ka, pb, format!("AllowedIPs = 10.80.{i}.1/32\n")),
    ] {
        let path = dir.join(format!("{}.conf", d.ifname));
        std::fs::write(
            &path,
            format!(
                "[Interface]\nPrivateKey = {}\nListenPort = {port}\n\n[Peer]\nPublicKey = {}\n{peer}",
                me.private, other.public
            ),
        )
        .unwrap();
        d.wg(&format!("setconf IF {}", path.display()));
        let _ = std::fs::remove_file(path);
    }
    for (ns, d, host) in [(&pair.a, a, 1), (&pair.b, b, 2)] {
        ns.run_ok(&format!(
            "ip addr add 10.80.{i}.{host}/24 dev {0} && ip link set {0} mtu {1} up",
            d.ifname,
            crate::impls::TUNNEL_MTU
        ));
    }
    format!("10.80.{i}.2").parse().unwrap()
}

/// The names of a process's threads (none if it is gone). A thread that ends while
/// they are read has no name left and is not counted.
pub fn thread_names(pid: u32) -> Vec<String> {
    crate::cpu::read_threads(pid)
        .into_values()
        .map(|(name, _)| name)
        .filter(|name| !name.is_empty())
        .collect()
}

/// Waits until `cond` holds, for at most `timeout`; fails the test naming `what`.
/// Polls often at first (a restart is expected within milliseconds), then every
/// 250 ms, so a slow condition (an HTTP query, a shell command) is not hammered.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// Runs the wirelane binary `bin` in `ns` with `args` (logging errors only) and
/// returns its output.
pub fn run_wirelane(bin: &str, ns: &Netns, args: &[&str]) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, bin])
        .args(args)
        .env("LOG_LEVEL", "error")
        .output()
        .unwrap()
}

/// The tunnels pool `pool` in `ns` serves, sorted (`bin --pool POOL --list`).
pub fn pool_tunnels(bin: &str, ns: &Netns, pool: &str) -> Vec<String> {
    let o = run_wirelane(bin, ns, &["--pool", pool, "--list"]);
    assert!(o.status.success(), "{o:?}");
    let mut names: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// Whether interface `ifname` exists in namespace `ns`.
pub fn link_exists(ns: &Netns, ifname: &str) -> bool {
    ns.try_run_ok(&format!("ip link show dev {ifname}"))
        .status
        .success()
}

/// A child process (a daemon in the foreground, a server) killed and reaped when the
/// test ends, however it ends.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    /// SIGTERM first, so that a daemon removes what it made (its sockets and their
    /// lock files, its interfaces), which SIGKILL would leave behind; SIGKILL if it has
    /// not ended within 5 s.
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill has no memory preconditions; the pid is our unreaped child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
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
