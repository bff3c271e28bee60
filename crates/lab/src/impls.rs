//! Implementations under test. Daemons are started like wireguard-go (`CMD -f IFNAME`)
//! as children of the lab, configured through `wg`, and stopped and reaped when their
//! guard drops. `kernel` uses the in-kernel module where the machine has one; `none`
//! is the plain veth path, shown as the ceiling.

use crate::netns::{self, unique, Netns};
use crate::topology::Testbed;
use crate::Result;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use wirelane_dataplane::exec::{Model, MAX_WORKERS};
use wirelane_dataplane::fq_codel::QueueDiscipline;

/// Which wirelane: this build or another one registered by name (for A/B runs), and
/// the settings it runs with. Written `wirelane[@BUILD][:MODEL][/WORKERS][+QUEUE][+metrics]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Flavor {
    /// Another build, by its index in [`builds`]; None: the one built with this lab.
    pub build: Option<u8>,
    /// The execution model (`--model`); None: the daemon's default.
    pub model: Option<Model>,
    /// Crypt workers (`--workers`, written `/W`); None: the daemon's default (one per
    /// core). The model's calibration sweeps it.
    pub workers: Option<u16>,
    /// The queue discipline (`--queue`: `+fq-codel` or `+fifo`); None: the default.
    pub queue: Option<QueueDiscipline>,
    /// Serving metrics (`--metrics` on loopback), scraped every [`SCRAPE_EVERY`] while
    /// it runs: what a Prometheus costs the data path.
    pub scraped: bool,
}

/// Where a `+metrics` daemon serves them, in its own namespace.
const METRICS_ADDR: &str = "127.0.0.1:9586";
/// How often the lab scrapes a `+metrics` daemon: 15 times Prometheus's default rate,
/// so that any cost a scrape puts on the data path shows.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(1);

/// The daemon options a wirelane flavor adds to its command line.
fn flavor_args(which: Impl) -> Vec<String> {
    let mut args: Vec<&str> = Vec::new();
    let workers;
    if let Impl::Wirelane(fl) = which {
        if let Some(m) = fl.model {
            args.extend(["--model", m.name()]);
        }
        if let Some(w) = fl.workers {
            workers = w.to_string();
            args.extend(["--workers", &workers]);
        }
        if let Some(q) = fl.queue {
            args.extend(["--queue", q.name()]);
        }
        if fl.scraped {
            args.extend(["--metrics", METRICS_ADDR]);
        }
    }
    args.into_iter().map(String::from).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Impl {
    Wirelane(Flavor),
    WireguardGo,
    Boringtun,
    Kernel,
    None,
}

/// This build of wirelane with its defaults.
pub const WIRELANE: Impl = Impl::Wirelane(Flavor {
    build: None,
    model: None,
    workers: None,
    queue: None,
    scraped: false,
});

/// Every implementation's tunnel MTU in the lab: wg-quick's over an Ethernet MTU of
/// 1,500 (80 bytes for the outer IPv6, UDP and WireGuard headers). Set explicitly:
/// the kernel, wireguard-go and wirelane default to it, but boringtun leaves its TUN
/// at Linux's 1,500, where its outer datagrams (1,560 bytes) are fragmented on the
/// 1,500-byte link and its TCP runs with a larger MSS.
pub const TUNNEL_MTU: u16 = 1420;

pub const ALL: [Impl; 5] = [
    WIRELANE,
    Impl::WireguardGo,
    Impl::Boringtun,
    Impl::Kernel,
    Impl::None,
];

/// Other wirelane builds, by name: `--build NAME=PATH` on the command line, or
/// `WIRELANE_LAB_BUILDS=NAME=PATH[,NAME=PATH...]` in the environment.
fn builds() -> &'static Mutex<Vec<(String, PathBuf)>> {
    static BUILDS: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    // Entries that do not parse are left out here; `check_env_builds` names them.
    BUILDS.get_or_init(|| Mutex::new(env_builds().unwrap_or_default()))
}

const BUILDS_ENV: &str = "WIRELANE_LAB_BUILDS";

/// The builds `WIRELANE_LAB_BUILDS` names, each checked as `--build` checks one.
fn env_builds() -> Result<Vec<(String, PathBuf)>> {
    let text = std::env::var(BUILDS_ENV).unwrap_or_default();
    let mut list: Vec<(String, PathBuf)> = Vec::new();
    for spec in text.split(',').filter(|s| !s.is_empty()) {
        let (name, path) = parse_build(spec).map_err(|e| format!("{BUILDS_ENV}: {e}"))?;
        list.retain(|(n, _)| *n != name);
        list.push((name, path));
    }
    if list.len() > MAX_BUILDS {
        return Err(format!("{BUILDS_ENV}: more than {MAX_BUILDS} builds").into());
    }
    Ok(list)
}

/// Fails naming the first entry of `WIRELANE_LAB_BUILDS` that is not NAME=PATH of an
/// existing file: left out silently, its name was later "not registered".
pub fn check_env_builds() -> Result<()> {
    env_builds().map(drop)
}

/// Builds one run may name (an index fits a byte).
const MAX_BUILDS: usize = u8::MAX as usize;

fn parse_build(spec: &str) -> Result<(String, PathBuf)> {
    let (name, path) = spec
        .split_once('=')
        .ok_or_else(|| format!("a build is NAME=PATH, not '{spec}'"))?;
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(format!("build name '{name}': letters, digits, '-' and '_' only").into());
    }
    if !std::path::Path::new(path).is_file() {
        return Err(format!("build '{name}': {path} is not a file").into());
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

/// Registers another wirelane build as `wirelane@NAME`.
pub fn register_build(spec: &str) -> Result<()> {
    let (name, path) = parse_build(spec).map_err(|e| format!("--build: {e}"))?;
    let mut b = builds().lock().unwrap_or_else(|p| p.into_inner());
    b.retain(|(n, _)| *n != name);
    if b.len() >= MAX_BUILDS {
        return Err("too many builds".into());
    }
    b.push((name, path));
    Ok(())
}

impl std::fmt::Display for Impl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Impl::Wirelane(fl) => {
                f.write_str("wirelane")?;
                if let Some(i) = fl.build {
                    let b = builds().lock().unwrap_or_else(|p| p.into_inner());
                    let name = b.get(usize::from(i)).map_or("?", |(n, _)| n.as_str());
                    write!(f, "@{name}")?;
                }
                if let Some(m) = fl.model {
                    write!(f, ":{m}")?;
                }
                if let Some(w) = fl.workers {
                    write!(f, "/{w}")?;
                }
                if let Some(q) = fl.queue {
                    write!(f, "+{q}")?;
                }
                if fl.scraped {
                    f.write_str("+metrics")?;
                }
                Ok(())
            }
            Impl::WireguardGo => f.write_str("wireguard-go"),
            Impl::Boringtun => f.write_str("boringtun"),
            Impl::Kernel => f.write_str("kernel"),
            Impl::None => f.write_str("none"),
        }
    }
}

impl std::str::FromStr for Impl {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let unknown = || {
            format!(
                "unknown implementation '{s}' (known: wirelane[@BUILD][:MODEL][/WORKERS][+QUEUE][+metrics], \
                 wireguard-go, boringtun, kernel, none; models: workqueue, threaded, softirq; \
                 queues: fq-codel, fifo)"
            )
        };
        let Some(rest) = s.strip_prefix("wirelane") else {
            return [Impl::WireguardGo, Impl::Boringtun, Impl::Kernel, Impl::None]
                .into_iter()
                .find(|i| i.name() == s)
                .ok_or_else(unknown);
        };
        let (rest, scraped) = match rest.strip_suffix("+metrics") {
            Some(r) => (r, true),
            None => (rest, false),
        };
        let (rest, queue) = match rest.rsplit_once('+') {
            Some((r, q)) => (r, Some(q.parse::<QueueDiscipline>()?)),
            None => (rest, None),
        };
        let (rest, workers) = match rest.rsplit_once('/') {
            Some((r, w)) => {
                let n: u16 = w
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_WORKERS).contains(&usize::from(*n)))
                    .ok_or_else(|| {
                        format!("'{s}': the worker count after '/' must be 1 to {MAX_WORKERS}")
                    })?;
                (r, Some(n))
            }
            None => (rest, None),
        };
        let (rest, model) = match rest.split_once(':') {
            Some((r, m)) => (r, Some(m.parse::<Model>()?)),
            None => (rest, None),
        };
        let build = match rest {
            "" => None,
            b => {
                let name = b.strip_prefix('@').ok_or_else(unknown)?;
                let list = builds().lock().unwrap_or_else(|p| p.into_inner());
                let i = list.iter().position(|(n, _)| n == name).ok_or_else(|| {
                    format!("no build named '{name}' (register it with --build {name}=PATH)")
                })?;
                Some(u8::try_from(i).map_err(|_| "too many builds")?)
            }
        };
        Ok(Impl::Wirelane(Flavor {
            build,
            model,
            workers,
            queue,
            scraped,
        }))
    }
}

/// Finds a program on PATH or in the per-user install directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(PathBuf::from)
        .chain([
            PathBuf::from(format!("{home}/go/bin")),
            PathBuf::from(format!("{home}/.cargo/bin")),
        ])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Impl {
    pub fn name(self) -> String {
        self.to_string()
    }

    /// Whether this is a wirelane build.
    pub fn is_wirelane(self) -> bool {
        matches!(self, Impl::Wirelane(_))
    }

    fn program(self) -> Result<PathBuf> {
        let (name, hint) = match self {
            Impl::Wirelane(Flavor { build: Some(i), .. }) => {
                let b = builds().lock().unwrap_or_else(|p| p.into_inner());
                return b
                    .get(usize::from(i))
                    .map(|(_, p)| p.clone())
                    .ok_or_else(|| "unknown build".into());
            }
            Impl::Wirelane(_) => {
                // The daemon built alongside this lab binary, or alongside the test
                // binary running the lab's library (which lives in `deps/`).
                let exe = std::env::current_exe()?;
                let dirs = [exe.parent(), exe.parent().and_then(|d| d.parent())];
                for dir in dirs.into_iter().flatten() {
                    let sibling = dir.join("wirelane");
                    if sibling.is_file() {
                        return Ok(sibling);
                    }
                }
                ("wirelane", "cargo build --release -p wirelane")
            }
            Impl::WireguardGo => (
                "wireguard-go",
                "scripts/install-deps.sh (go install golang.zx2c4.com/wireguard@…)",
            ),
            Impl::Boringtun => (
                "boringtun-cli",
                "scripts/install-deps.sh (cargo install boringtun-cli)",
            ),
            _ => return Err(format!("{} has no daemon", self.name()).into()),
        };
        find_tool(name)
            .ok_or_else(|| format!("{name} is not installed; install it with: {hint}").into())
    }

    /// Whether this implementation can run on this machine, or why not.
    pub fn available(self) -> std::result::Result<(), String> {
        match self {
            Impl::None => Ok(()),
            Impl::Kernel => {
                if std::path::Path::new("/sys/module/wireguard").exists() {
                    Ok(())
                } else {
                    Err("this kernel has no WireGuard module".into())
                }
            }
            _ => self.program().map(|_| ()).map_err(|e| e.to_string()),
        }
    }

    pub fn version(self) -> String {
        match self {
            Impl::None => "veth".into(),
            Impl::Kernel => netns::sh("uname -r")
                .map(|s| format!("linux {}", s.trim()))
                .unwrap_or_default(),
            _ => self
                .program()
                .ok()
                .and_then(|p| std::process::Command::new(p).arg("--version").output().ok())
                .map(|o| {
                    let s = String::from_utf8_lossy(&o.stdout).to_string()
                        + &String::from_utf8_lossy(&o.stderr);
                    s.lines()
                        .find(|l| !l.trim().is_empty() && !l.contains('│') && !l.contains('┌'))
                        .unwrap_or("")
                        .trim()
                        .to_string()
                })
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

/// A running tunnel end: a daemon started in the foreground as the lab's child (or a
/// kernel interface), stopped and reaped when the guard drops. Its standard error goes
/// to a log file, removed with it.
pub struct Daemon {
    child: Option<Child>,
    pub pid: Option<u32>,
    pub ifname: String,
    pub which: Impl,
    /// The namespace it was started in (where its UDP sockets live).
    pub ns: String,
    log: PathBuf,
    /// Scrapes its metrics while it runs (`+metrics`).
    scraper: Option<Scraper>,
}

/// A thread in the daemon's namespace that GETs its `/metrics` every [`SCRAPE_EVERY`].
struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scraper {
    fn start(ns: &str) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, ns) = (stop.clone(), ns.to_string());
        let thread = std::thread::spawn(move || {
            if crate::netns::enter(&ns).is_err() {
                return;
            }
            while !flag.load(Ordering::Relaxed) {
                let next = Instant::now() + SCRAPE_EVERY;
                // A failed scrape is not the data path's business; the next one retries.
                let _ = scrape_once();
                while !flag.load(Ordering::Relaxed) && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Scraper {
            stop,
            thread: Some(thread),
        }
    }
}

/// One whole scrape of a `+metrics` daemon from inside its namespace: the request, and
/// every byte of the answer.
pub fn scrape_once() -> std::io::Result<usize> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(METRICS_ADDR)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts scraping `d` if its flavor asks for it.
fn scrape_if_asked(d: &mut Daemon) {
    if let Impl::Wirelane(Flavor { scraped: true, .. }) = d.which {
        d.scraper = Some(Scraper::start(&d.ns));
    }
}

/// A `+metrics` daemon listens on loopback, which a fresh namespace has down.
fn prepare_ns(which: Impl, ns: &Netns) -> Result<()> {
    if let Impl::Wirelane(Flavor { scraped: true, .. }) = which {
        ns.run("ip link set lo up")?;
    }
    Ok(())
}

impl Daemon {
    /// A handle on another interface served by this daemon's process; dropping it
    /// leaves the process and the interface as they are.
    pub fn sharing(&self, ifname: &str) -> Daemon {
        Daemon {
            pid: self.pid,
            child: None,
            ifname: ifname.to_string(),
            which: self.which,
            ns: self.ns.clone(),
            log: self.log.clone(),
            scraper: None,
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit, then kills; the exit
    /// status if it exited on its own.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// Stops the lab's background scrapes of a `+metrics` daemon.
    pub fn stop_scraping(&mut self) {
        self.scraper = None;
    }

    /// What the daemon wrote to its standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Only the handle that owns the process cleans up; `sharing` handles do not.
        if self.child.is_none() {
            return;
        }
        self.scraper = None;
        // Generous: a process serving many tunnels unregisters each TUN as it goes,
        // and a killed one leaves its sockets behind.
        self.terminate(Duration::from_secs(10));
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{}.sock", self.ifname));
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Starts one wirelane process in `ns` serving `n` new interfaces; the first daemon
/// owns the process, the others share it (dropping them leaves it running).
pub fn start_many(which: Impl, ns: &Netns, n: usize) -> Result<Vec<Daemon>> {
    if n == 1 {
        return Ok(vec![start(which, ns)?]);
    }
    let names: Vec<String> = (0..n).map(|_| unique("lw")).collect();
    start_wirelane(which, ns, &names, &[])
}

/// Starts `n` tunnel ends in `ns`: wirelane serves them all from one process (one pool
/// of workers); the others run one process per tunnel, as their users must.
pub fn start_tunnels(which: Impl, ns: &Netns, n: usize) -> Result<Vec<Daemon>> {
    if which.is_wirelane() {
        start_many(which, ns, n)
    } else {
        (0..n).map(|_| start(which, ns)).collect()
    }
}

/// Starts one wirelane process (in the foreground, as the lab's child) in `ns`,
/// serving interfaces `names`, with `extra` arguments.
pub fn start_wirelane(
    which: Impl,
    ns: &Netns,
    names: &[String],
    extra: &[&str],
) -> Result<Vec<Daemon>> {
    let log = std::env::temp_dir().join(format!("{}.log", names[0]));
    prepare_ns(which, ns)?;
    let mut cmd = ns.command(which.program()?.to_str().ok_or("non-UTF-8 path")?);
    cmd.arg("-f").args(extra).args(flavor_args(which));
    let child = cmd
        .args(names)
        .env("LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let pid = child.id();
    let mut owner = Daemon {
        pid: Some(pid),
        child: Some(child),
        ifname: names[0].clone(),
        which,
        ns: ns.name.clone(),
        log,
        scraper: None,
    };
    wait_for_socket(&mut owner, names)?;
    scrape_if_asked(&mut owner);
    let others: Vec<Daemon> = names[1..].iter().map(|n| owner.sharing(n)).collect();
    let mut all = vec![owner];
    all.extend(others);
    Ok(all)
}

/// Waits until every interface in `names` has its UAPI socket, or `d` exits.
fn wait_for_socket(d: &mut Daemon, names: &[String]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for name in names {
        let sock = format!("/var/run/wireguard/{name}.sock");
        while !std::path::Path::new(&sock).exists() {
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(format!(
                    "{} exited during start-up: {st}: {}",
                    d.which.name(),
                    d.log()
                )
                .into());
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not create its UAPI socket", d.which.name()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

pub fn start(which: Impl, ns: &Netns) -> Result<Daemon> {
    let ifname = unique("lw");
    let log = std::env::temp_dir().join(format!("{ifname}.log"));
    if which == Impl::Kernel {
        ns.run(&format!("ip link add {ifname} type wireguard"))?;
        return Ok(Daemon {
            child: None,
            pid: None,
            ifname,
            which,
            ns: ns.name.clone(),
            log,
            scraper: None,
        });
    }
    prepare_ns(which, ns)?;
    let mut cmd = ns.command(which.program()?.to_str().ok_or("non-UTF-8 path")?);
    cmd.arg("-f").args(flavor_args(which));
    if which == Impl::Boringtun {
        cmd.arg("--disable-drop-privileges");
    }
    let child = cmd
        .arg(&ifname)
        .env("WG_PROCESS_FOREGROUND", "1")
        .env("LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let mut d = Daemon {
        pid: Some(child.id()),
        child: Some(child),
        ifname,
        which,
        ns: ns.name.clone(),
        log,
        scraper: None,
    };
    let names = [d.ifname.clone()];
    wait_for_socket(&mut d, &names)?;
    scrape_if_asked(&mut d);
    Ok(d)
}

/// The tunnel (or plain path) a workload runs over; for `multi:T`, T tunnels.
pub struct Tunnel {
    /// Host A's tunnel ends, then host B's.
    pub daemons: Vec<Daemon>,
    /// Address of host A and host B as the workload sees them (the first tunnel's).
    pub addr_a: IpAddr,
    pub addr_b: IpAddr,
    /// Every tunnel's inner addresses, host A's then host B's.
    pub pairs: Vec<(IpAddr, IpAddr)>,
}

impl Tunnel {
    /// Brings up a tunnel for every link of `bed`. wirelane serves all of a host's
    /// tunnels from one process (one pool of workers); the others run one process per
    /// tunnel, as their users must.
    pub fn up(which: Impl, bed: &Testbed) -> Result<Tunnel> {
        let first = &bed.links[0];
        if which == Impl::None {
            let (ha, hb) = (&bed.hosts[first.a], &bed.hosts[first.b]);
            return Ok(Tunnel {
                daemons: Vec::new(),
                addr_a: ha.underlay,
                addr_b: hb.underlay,
                pairs: vec![(ha.underlay, hb.underlay)],
            });
        }
        which.available()?;
        let n = bed.links.len();
        let mut ends: Vec<Vec<Daemon>> = Vec::new();
        for host in [&bed.hosts[first.a], &bed.hosts[first.b]] {
            ends.push(start_tunnels(which, &host.ns, n)?);
        }
        let mut pairs = Vec::new();
        for (t, link) in bed.links.iter().enumerate() {
            let keys: Vec<(String, String)> = (0..2)
                .map(|_| -> Result<(String, String)> {
                    let private = netns::sh("wg genkey")?.trim().to_string();
                    let public = netns::sh(&format!("echo {private} | wg pubkey"))?
                        .trim()
                        .to_string();
                    Ok((private, public))
                })
                .collect::<Result<_>>()?;
            let inner = [format!("10.81.{t}.1"), format!("10.81.{t}.2")];
            let sides = [
                (&bed.hosts[link.a], link.a_port, link.a_sends_to),
                (&bed.hosts[link.b], link.b_port, link.b_sends_to),
            ];
            for (i, (host, port, sends_to)) in sides.into_iter().enumerate() {
                let d = &ends[i][t];
                let keyfile = std::env::temp_dir().join(format!("{}.key", d.ifname));
                std::fs::write(&keyfile, format!("{}\n", keys[i].0))?;
                let other = 1 - i;
                let r = host.ns.run(&format!(
                    "wg set {if_} private-key {kf} listen-port {port} peer {pk} endpoint {ep} allowed-ips {ip}/32 \
                     && ip addr add {me}/24 dev {if_} && ip link set {if_} mtu {mtu} up",
                    if_ = d.ifname,
                    kf = keyfile.display(),
                    pk = keys[other].1,
                    ep = sends_to,
                    ip = inner[other],
                    me = inner[i],
                    mtu = TUNNEL_MTU,
                ));
                let _ = std::fs::remove_file(&keyfile);
                r?;
            }
            pairs.push((inner[0].parse()?, inner[1].parse()?));
        }
        let daemons = ends.into_iter().flatten().collect();
        Ok(Tunnel {
            daemons,
            addr_a: pairs[0].0,
            addr_b: pairs[0].1,
            pairs,
        })
    }

    /// The distinct daemon processes of host a and of host b (one per host for
    /// wirelane, one per tunnel end for the others): `daemons` holds host a's tunnel
    /// ends first, one per tunnel.
    pub fn pids_by_host(&self) -> [Vec<u32>; 2] {
        let (a, b) = self
            .daemons
            .split_at(self.pairs.len().min(self.daemons.len()));
        [a, b].map(|ends| {
            let mut p: Vec<u32> = ends.iter().filter_map(|d| d.pid).collect();
            p.sort_unstable();
            p.dedup();
            p
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_build;

    /// A build entry is NAME=PATH of an existing file, its name plain.
    #[test]
    fn build_entries_are_checked() {
        assert!(parse_build("a=/bin/sh").is_ok());
        for bad in ["bogus", "=/bin/sh", "a b=/bin/sh", "a=/no/such/file"] {
            assert!(parse_build(bad).is_err(), "{bad}");
        }
    }

    use super::*;

    #[test]
    fn implementation_names_roundtrip() {
        for name in [
            "wirelane",
            "wirelane:softirq",
            "wirelane+metrics",
            "wirelane:threaded+metrics",
            "wirelane+fifo",
            "wirelane:workqueue+fq-codel+metrics",
            "wirelane:softirq/1",
            "wirelane/2+fifo",
            "wireguard-go",
            "boringtun",
        ] {
            let i: Impl = name.parse().unwrap();
            assert_eq!(i.to_string(), name);
        }
        let scraped: Impl = "wirelane:workqueue+metrics".parse().unwrap();
        assert!(matches!(
            scraped,
            Impl::Wirelane(Flavor {
                scraped: true,
                model: Some(Model::Workqueue),
                workers: None,
                queue: None,
                build: None
            })
        ));
        assert_eq!(
            flavor_args(scraped),
            ["--model", "workqueue", "--metrics", METRICS_ADDR]
        );
        let fifo: Impl = "wirelane:threaded/1+fifo".parse().unwrap();
        assert_eq!(
            flavor_args(fifo),
            ["--model", "threaded", "--workers", "1", "--queue", "fifo"]
        );
        for bad in [
            "wirelane+",
            "wirelane+metric",
            "wirelane:nope",
            "wirelane+lifo",
            "wirelane:threaded+fifo+",
            "wirelane:threaded/0",
            "wirelane:threaded/x",
            "wirelane/99999",
            "wireguard-go+metrics",
        ] {
            assert!(bad.parse::<Impl>().is_err(), "{bad}");
        }
    }
}
