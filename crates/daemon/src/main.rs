//! `wirelane`: a user-space WireGuard daemon, started like wireguard-go
//! (`wirelane [-f] IFNAME`) and configured with `wg` over the UAPI socket. One process
//! may serve several interfaces from one set of threads (`wirelane IFNAME...`, or a
//! pool that `wirelane --pool NAME IFNAME` joins; see `pool`).

use clap::{CommandFactory, Parser};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use wirelane_daemon::http::{MetricsServer, Render};
use wirelane_daemon::pool::{self, Control, Request, POOL_ENV};
use wirelane_daemon::supervisor::{
    allowed_ip_limit, open_tunnel, peer_limit, Stop, Supervisor, Tunnel, TunnelOptions,
};
use wirelane_daemon::{daemonize, metrics, parse_ifname, privileges};
use wirelane_dataplane::codel::CodelParams;
use wirelane_dataplane::exec::{Model, MAX_WORKERS};
use wirelane_dataplane::fq_codel::{QueueDiscipline, QueuePolicy};
use wirelane_dataplane::Runtime;
use wirelane_io::netlink::Monitor;
use wirelane_io::tun::MAX_QUEUES as TUN_MAX_QUEUES;

#[derive(Parser, Debug)]
#[command(
    name = "wirelane",
    version,
    about = "Multi-core user-space WireGuard daemon, a drop-in for wireguard-go",
    long_about = "Creates the TUN interface IFNAME (or each IFNAME given) and serves the \
WireGuard UAPI on /var/run/wireguard/IFNAME.sock (mode 0600), so that wg, wg show, wg \
setconf/syncconf and `WG_QUICK_USERSPACE_IMPLEMENTATION=wirelane wg-quick` work \
unchanged. Several interfaces in one process share one set of worker threads.\n\n\
With --pool NAME (or WIRELANE_POOL=NAME), the interfaces join the pool of that name if \
a wirelane process serves it in this network namespace, or else this process becomes \
it; so `WIRELANE_POOL=gw WG_QUICK_USERSPACE_IMPLEMENTATION=wirelane wg-quick up wgN` \
brings each tunnel into one process. --remove and --list manage a running pool.\n\n\
Without --foreground it returns once the interfaces are ready and keeps running in the \
background, as wg-quick expects. An interface stops when its UAPI socket or the \
interface itself is deleted (wg-quick down); the process stops with its last interface \
(unless --stay) or on SIGINT or SIGTERM, removing its sockets and interfaces.",
    after_help = "Environment:\n  \
WIRELANE_POOL  the pool to join or start, as --pool\n  \
WIRELANE_METRICS  ADDR:PORT to serve metrics on, as --metrics\n  \
WIRELANE_LOG   log filter, e.g. info, debug, wirelane_dataplane=trace (overrides --log-level)\n  \
LOG_LEVEL      wireguard-go compatible: verbose, error or silent\n\n\
Examples:\n  wirelane wg0 && wg setconf wg0 wg0.conf && ip link set wg0 up\n  \
wirelane -f wg0 wg1 wg2\n  \
wirelane --pool gw wg3 && wirelane --pool gw --list"
)]
struct Cli {
    /// Stay in the foreground instead of detaching once the interfaces are ready.
    #[arg(short, long)]
    foreground: bool,

    /// Log level: error, warn, info, debug or trace (default: info). Given, the
    /// daemon keeps logging to stderr once in the background.
    #[arg(long, value_name = "LEVEL",
          value_parser = ["error", "warn", "info", "debug", "trace", "off"])]
    log_level: Option<String>,

    /// Execution model that runs the pipeline stages: workqueue (one pool, every
    /// stage at equal priority), threaded (a thread per peer for its serial stages) or
    /// softirq (a higher-priority poller per core, as the kernel; for study).
    #[arg(long, value_name = "MODEL", default_value = "workqueue")]
    model: Model,

    /// How transmit packets queue before encryption: fq-codel (flow fairness, so a
    /// request does not wait behind a bulk transfer, and CoDel, which keeps each
    /// flow's queue short by marking ECN-capable packets or dropping) or fifo (one
    /// queue per peer, as kernel WireGuard; for comparison).
    #[arg(long, value_name = "QUEUE", default_value = "fq-codel")]
    queue: QueueDiscipline,

    /// CoDel's target with fq-codel: the standing sojourn a queue may keep, in both
    /// directions (e.g. 500us, 5ms).
    #[arg(long, value_name = "DURATION", default_value = "5ms", value_parser = parse_duration)]
    codel_target: Duration,

    /// CoDel's interval with fq-codel: how long the sojourn must stay above target
    /// before the first drop or mark, and the base of their spacing; about the longest
    /// round trip expected of the tunnel's inner flows.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration)]
    codel_interval: Duration,

    /// Peers each interface may hold; a configuration that would exceed it is refused
    /// whole (default: what half the memory the process may use holds at 8 KiB a peer,
    /// at most 1,048,576, the kernel's bound).
    #[arg(long, value_name = "N")]
    max_peers: Option<usize>,

    /// AllowedIPs prefixes each interface may hold, over all its peers; a configuration
    /// that could exceed it is refused whole (default: what a quarter of the memory
    /// the process may use holds at 512 bytes a prefix, at most 67,108,864).
    #[arg(long, value_name = "N")]
    max_allowed_ips: Option<usize>,

    /// Do not ask the TUN for checksum and segmentation offloads (IFF_VNET_HDR).
    #[arg(long)]
    no_offloads: bool,

    /// TUN queues, each read by a reader of its own (IFF_MULTI_QUEUE; default: one per
    /// crypt worker, at most 16). The kernel spreads what is routed into the interface
    /// over the queues by flow. 1 makes a single-queue device, as wireguard-go does.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=TUN_MAX_QUEUES as i64))]
    tun_queues: Option<u16>,

    /// Crypt worker threads (default: one per online CPU).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_WORKERS as i64))]
    workers: Option<u16>,

    /// Serve Prometheus metrics on http://ADDR:PORT/metrics (default: $WIRELANE_METRICS;
    /// off without it). Listen on loopback or a management address: the metrics name
    /// every peer's public key.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,

    /// Join the pool NAME, or become it (default: $WIRELANE_POOL).
    #[arg(long, value_name = "NAME", value_parser = parse_pool)]
    pool: Option<String>,

    /// Keep the pool running when its last interface goes.
    #[arg(long)]
    stay: bool,

    /// Remove IFNAME from the pool, and exit.
    #[arg(long, value_name = "IFNAME", value_parser = parse_ifname,
          conflicts_with_all = ["ifnames", "list"])]
    remove: Option<String>,

    /// List the pool's interfaces, and exit.
    #[arg(long, conflicts_with = "ifnames")]
    list: bool,

    /// Print the man page (man) or a shell completion script (complete-bash,
    /// complete-zsh), and exit; for packages.
    #[arg(long, value_name = "KIND", hide = true, exclusive = true,
          value_parser = ["man", "complete-bash", "complete-zsh"])]
    generate: Option<String>,

    /// Names of the interfaces to create, 1 to 15 characters each (none: an empty
    /// pool that stays, for tunnels to join; needs --pool and --stay).
    #[arg(value_name = "IFNAME", value_parser = parse_ifname,
          required_unless_present_any = ["remove", "list", "stay", "generate"])]
    ifnames: Vec<String>,
}

/// A duration of `<integer><unit>`, the unit one of ns, us, ms and s, between 1 us
/// and 10 s.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let at = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(at);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a duration such as 500us or 5ms"))?;
    let d = match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(format!("'{s}': the unit must be ns, us, ms or s")),
    };
    if d < Duration::from_micros(1) || d > Duration::from_secs(10) {
        return Err(format!("'{s}' is outside 1us..=10s"));
    }
    Ok(d)
}

fn parse_pool(s: &str) -> Result<String, String> {
    pool::validate_name(s).map(|_| s.to_string())
}

/// A variable's value, if it is set to something (`VAR=` counts as unset).
fn set_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn init_logging(cli: &Cli) {
    // An explicit --log-level wins over LOG_LEVEL (which the units set); an empty
    // variable counts as unset.
    let level = match (&cli.log_level, set_var("LOG_LEVEL").as_deref()) {
        (Some(l), _) => l.clone(),
        (None, Some("verbose" | "debug")) => "debug".to_string(),
        (None, Some("error")) => "error".to_string(),
        (None, Some("silent")) => "off".to_string(),
        _ => "info".to_string(),
    };
    // A filter in WIRELANE_LOG was checked before (`check`): unset, the level rules.
    let filter = set_var(LOG_ENV)
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(level));
    // Colour only on a terminal: escape codes in the journal make journalctl show
    // every line as "[N B blob data]".
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_target(false)
        .init();
}

/// Blocks SIGINT, SIGTERM and SIGHUP in every thread and returns a signalfd for them.
/// Must run before any thread is spawned so the mask is inherited.
fn signal_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset operations on a local, zero-initialised set; results checked.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Refuses arguments clap cannot judge alone, as clap would: message and exit code 2.
fn check(cli: &mut Cli) {
    let usage = |msg: String| -> ! {
        Cli::command()
            .error(clap::error::ErrorKind::ValueValidation, msg)
            .exit()
    };
    // Set but unusable (not UTF-8, or not a filter) is an error, not "unset".
    // Empty counts as unset (`VAR=` in /etc/default or a unit's drop-in).
    let env = |name: &str| match std::env::var(name) {
        Ok(v) if v.is_empty() => None,
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => usage(format!("{name}: not UTF-8")),
    };
    if let Some(f) = env(LOG_ENV) {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&f) {
            usage(format!("{LOG_ENV}: '{f}' is not a log filter: {e}"));
        }
    }
    if cli.pool.is_none() {
        if let Some(p) = env(POOL_ENV) {
            if let Err(e) = pool::validate_name(&p) {
                usage(format!("{POOL_ENV}: {e}"));
            }
            cli.pool = Some(p);
        }
    }
    if cli.metrics.is_none() {
        if let Some(m) = env(METRICS_ENV) {
            match m.parse() {
                Ok(a) => cli.metrics = Some(a),
                Err(_) => usage(format!("{METRICS_ENV}: '{m}' is not ADDR:PORT")),
            }
        }
    }
    if (cli.remove.is_some() || cli.list || cli.stay) && cli.pool.is_none() {
        usage("--remove, --list and --stay need a pool (--pool NAME)".into());
    }
    let mut seen = std::collections::HashSet::new();
    for n in &cli.ifnames {
        if !seen.insert(n) {
            usage(format!("interface '{n}' is named twice"));
        }
    }
}

/// `--remove` and `--list`: one request to a running pool, asked again while it is busy
/// (as a joining tunnel asks).
fn control(pool_name: &str, req: Request) -> ExitCode {
    let answer = pool::control_path(pool_name).and_then(|p| pool::ask_patiently(&p, &req));
    match answer {
        Ok(Ok(detail)) => {
            if !detail.is_empty() {
                println!("{}", detail.replace(' ', "\n"));
            }
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("wirelane: {e}");
            ExitCode::FAILURE
        }
        // Only a socket that is not there means no pool; anything else (permission,
        // a pool that stopped answering) is said as it is.
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || e.kind() == io::ErrorKind::ConnectionRefused =>
        {
            eprintln!("wirelane: no pool '{pool_name}' in this network namespace ({e})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("wirelane: cannot ask pool '{pool_name}': {e}");
            ExitCode::FAILURE
        }
    }
}

/// How a request to join a running pool ended.
enum Joined {
    Done,
    /// No pool took the request: it exited, or is exiting, meanwhile.
    PoolGone,
}

/// Asks the running pool to add each interface; all or none: when one is refused,
/// those this request added are removed again.
fn join(pool_name: &str, ifnames: &[String]) -> Result<Joined, String> {
    let path = pool::control_path(pool_name).map_err(|e| e.to_string())?;
    for (i, n) in ifnames.iter().enumerate() {
        let refused = match pool::ask_patiently(&path, &Request::Add(n.clone())) {
            Ok(Ok(_)) => {
                tracing::info!(interface = %n, pool = pool_name, "joined the pool");
                continue;
            }
            Err(e) if i == 0 && pool::gone(&e) => return Ok(Joined::PoolGone),
            Ok(Err(e)) if i == 0 && e == pool::CLOSING => return Ok(Joined::PoolGone),
            Ok(Err(e)) => e,
            // Unanswered (a timeout): the pool may still add it, so it is removed too.
            Err(e) => format!("pool '{pool_name}' did not answer: {e}"),
        };
        let upto = if refused.starts_with("pool '") {
            i + 1
        } else {
            i
        };
        for added in &ifnames[..upto] {
            let _ = pool::ask_patiently(&path, &Request::Remove(added.clone()));
        }
        return Err(refused);
    }
    Ok(Joined::Done)
}

/// Where `--metrics` comes from when not given (the service unit sets it).
const METRICS_ENV: &str = "WIRELANE_METRICS";
/// The log filter (`tracing_subscriber::EnvFilter` syntax), over `--log-level`.
const LOG_ENV: &str = "WIRELANE_LOG";

/// Options that only a pool's first process applies.
fn warn_ignored_on_join(cli: &Cli, pool_name: &str) {
    if cli.model != Model::Workqueue
        || cli.workers.is_some()
        || cli.no_offloads
        || cli.tun_queues.is_some()
        || cli.queue != QueueDiscipline::default()
        || cli.codel_target != CodelParams::RFC_TARGET
        || cli.codel_interval != CodelParams::RFC_INTERVAL
        || cli.stay
        || cli.metrics.is_some()
        || cli.max_peers.is_some()
        || cli.max_allowed_ips.is_some()
    {
        tracing::warn!(
            pool = pool_name,
            "--model, --workers, --tun-queues, --queue, --codel-*, --no-offloads, --stay, --metrics, --max-peers and \
             --max-allowed-ips apply when a process starts a pool; the running pool keeps its own"
        );
    }
}

/// Becomes pool `name` (its control socket), or joins it if a live pool answers there;
/// None once joined. A pool exiting as we ask (its last tunnel just went) refuses,
/// and a moment later its socket is gone and this process becomes the pool.
fn bind_or_join(cli: &Cli, name: &str) -> Result<Option<Control>, String> {
    for _ in 0..50 {
        match Control::bind(name) {
            Ok(c) => return Ok(Some(c)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if cli.ifnames.is_empty() {
                    // An empty pool to start: an error if a live one answers, a retry
                    // if it is exiting.
                    if let Ok(Ok(_)) =
                        pool::control_path(name).and_then(|p| pool::ask(&p, &Request::List))
                    {
                        return Err(format!("pool '{name}' is already running here"));
                    }
                } else if let Joined::Done = join(name, &cli.ifnames)? {
                    warn_ignored_on_join(cli, name);
                    return Ok(None);
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(format!("cannot create pool '{name}': {e}")),
        }
    }
    Err(format!(
        "pool '{name}' is exiting and its control socket did not go"
    ))
}

fn run(cli: &Cli, readiness: &mut daemonize::Readiness) -> Result<(), String> {
    // Signals are held from here, a join included: a join adds its tunnels all or none,
    // and a signal partway through would leave some added.
    let sig = signal_fd().map_err(|e| format!("cannot set up signal handling: {e}"))?;
    // A pool's control socket first: if a live pool answers there, join it instead.
    let control = match &cli.pool {
        Some(p) => match bind_or_join(cli, p)? {
            Some(c) => Some(c),
            None => {
                readiness.ready();
                return Ok(());
            }
        },
        None => None,
    };
    let workers = cli
        .workers
        .map(usize::from)
        .unwrap_or_else(wirelane_dataplane::threads::cpus);
    // Everything that needs privileges, before they are dropped: the interfaces, and
    // the rtnetlink monitor that hears every namespace.
    let opts = TunnelOptions {
        offloads: !cli.no_offloads,
        tun_queues: cli
            .tun_queues
            .map_or(workers.min(TUN_MAX_QUEUES), usize::from),
        queue: QueuePolicy {
            discipline: cli.queue,
            codel: CodelParams::new(cli.codel_target, cli.codel_interval),
        },
        max_peers: peer_limit(cli.max_peers),
        max_allowed_ips: allowed_ip_limit(cli.max_allowed_ips),
    };
    // Bound before any interface exists: a taken port fails the start before it
    // creates anything, and once an interface's UAPI socket is there, the metrics
    // port already accepts connections.
    let metrics_listener = cli
        .metrics
        .map(|a| {
            std::net::TcpListener::bind(a).map_err(|e| format!("cannot serve metrics on {a}: {e}"))
        })
        .transpose()?;
    let mut opened: Vec<(String, Tunnel)> = Vec::new();
    for n in &cli.ifnames {
        // On failure, what was opened drops: its sockets go, and its interfaces.
        opened.push((n.clone(), open_tunnel(n, opts)?));
    }
    let monitor = Monitor::open()
        .inspect_err(|e| tracing::warn!(error = %e, "no rtnetlink notifications"))
        .ok();
    if monitor.as_ref().is_some_and(|m| !m.all_namespaces()) {
        tracing::info!("MTU changes are followed only while an interface stays in this namespace");
    }
    let keep: &[u32] = match cli.model {
        Model::Softirq => &privileges::KEPT_SOFTIRQ,
        _ => &privileges::KEPT,
    };
    let kept =
        privileges::drop_all_but(keep).map_err(|e| format!("cannot drop capabilities: {e}"))?;
    tracing::debug!(
        capabilities = format_args!("{kept:#x}"),
        "capabilities kept"
    );
    let runtime = Arc::new(
        Runtime::start(cli.model, workers, monitor)
            .map_err(|e| format!("cannot start workers: {e}"))?,
    );
    let sup = Arc::new(
        Supervisor::new(runtime.clone(), opts, cli.stay)
            .map_err(|e| format!("cannot start: {e}"))?,
    );
    for (n, t) in opened {
        sup.serve(&n, t)?;
    }
    let mut metrics = match metrics_listener {
        Some(l) => {
            let (sup, rt) = (sup.clone(), runtime.clone());
            let render: Render = Arc::new(move || metrics::render(&sup.devices(), &rt));
            Some(
                MetricsServer::start(l, render)
                    .map_err(|e| format!("cannot serve metrics: {e}"))?,
            )
        }
        None => None,
    };
    tracing::info!(
        interfaces = ?cli.ifnames,
        workers,
        model = %cli.model,
        pool = cli.pool.as_deref().unwrap_or("-"),
        "wirelane is up"
    );
    readiness.ready();

    match sup.run(&sig, control.as_ref()) {
        Stop::Signal(s) => tracing::info!(signal = s, "shutting down on signal"),
        Stop::LastTunnelGone => tracing::info!("the last interface is gone; shutting down"),
    }
    // Sockets first (so a restart finds the names free), then the threads.
    drop(control);
    if let Some(m) = metrics.as_mut() {
        m.stop();
    }
    sup.remove_all();
    runtime.stop();
    Ok(())
}

/// Writes what `--generate KIND` asks for to standard output.
fn generate(kind: &str) -> ExitCode {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let written = match kind {
        "man" => clap_mangen::Man::new(cmd).section("8").render(&mut out),
        shell => {
            let shell = match shell {
                "complete-zsh" => clap_complete::Shell::Zsh,
                _ => clap_complete::Shell::Bash,
            };
            clap_complete::generate(shell, &mut cmd, "wirelane", &mut out);
            Ok(())
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wirelane: cannot write: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    if let Some(kind) = &cli.generate {
        return generate(kind);
    }
    check(&mut cli);
    if let Some(p) = &cli.pool {
        if let Some(n) = &cli.remove {
            return control(p, Request::Remove(n.clone()));
        }
        if cli.list {
            return control(p, Request::List);
        }
    }
    // wireguard-go's environment: its foreground switch is honoured; descriptors
    // handed over by a parent are not supported, and refused rather than ignored (a
    // second TUN of the same name would be created beside the caller's).
    if std::env::var("WG_PROCESS_FOREGROUND").is_ok_and(|v| v == "1") {
        cli.foreground = true;
    }
    for var in ["WG_TUN_FD", "WG_UAPI_FD"] {
        if std::env::var_os(var).is_some() {
            eprintln!(
                "wirelane: {var} is set, but wirelane opens its own TUN device and UAPI \
                 socket; unset it"
            );
            return ExitCode::from(2);
        }
    }
    let detached = std::env::var_os(daemonize::READY_FD_ENV).is_some();
    if !cli.foreground && !detached {
        // Re-run ourselves in the background with the same arguments.
        let args: Vec<String> = std::env::args().skip(1).collect();
        // As wireguard-go keeps its output when LOG_LEVEL asks for any; an explicit
        // --log-level or WIRELANE_LOG asks as much.
        let keep_stderr = set_var(LOG_ENV).is_some()
            || cli.log_level.as_deref().is_some_and(|l| l != "off")
            || set_var("LOG_LEVEL").is_some_and(|l| l != "silent");
        return match daemonize::spawn_background(&args, keep_stderr) {
            Ok(0) => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("wirelane: cannot start the background daemon: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(&cli);
    let cores = wirelane_dataplane::threads::cpus();
    if wirelane_io::memory::limit_allocator_arenas(cores) {
        tracing::debug!("allocator arenas capped at {cores}, one per core");
    }
    let mut readiness = daemonize::Readiness::from_env();
    match run(&cli, &mut readiness) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            readiness.failed(&e);
            ExitCode::FAILURE
        }
    }
}
