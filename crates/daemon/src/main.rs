//! `wirelane`: a user-space WireGuard daemon, started like wireguard-go
//! (`wirelane [-f] IFNAME`) and configured with `wg` over the UAPI socket.

use clap::Parser;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;
use wirelane_daemon::{daemonize, listener, privileges};
use wirelane_dataplane::exec::{Model, MAX_WORKERS};
use wirelane_dataplane::{Interface, Runtime, Sockets};
use wirelane_io::tun::Tun;

#[derive(Parser, Debug)]
#[command(
    name = "wirelane",
    version,
    about = "Multi-core user-space WireGuard daemon, a drop-in for wireguard-go",
    long_about = "Creates the TUN interface IFNAME and serves the WireGuard UAPI on \
/var/run/wireguard/IFNAME.sock (mode 0600), so that wg, wg show, wg setconf/syncconf and \
`WG_QUICK_USERSPACE_IMPLEMENTATION=wirelane wg-quick` work unchanged.\n\n\
Without --foreground it returns once the interface is ready and keeps running in the \
background, as wg-quick expects. It stops on SIGINT or SIGTERM, when its UAPI socket is \
deleted, or when the interface is deleted (wg-quick down), removing the socket and the \
interface.",
    after_help = "Environment:\n  \
WIRELANE_LOG   log filter, e.g. info, debug, wirelane_dataplane=trace (overrides --log-level)\n  \
LOG_LEVEL      wireguard-go compatible: verbose, error or silent\n\n\
Example:\n  wirelane wg0 && wg setconf wg0 wg0.conf && ip link set wg0 up"
)]
struct Cli {
    /// Stay in the foreground instead of detaching once the interface is ready.
    #[arg(short, long)]
    foreground: bool,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "info",
          value_parser = ["error", "warn", "info", "debug", "trace", "off"])]
    log_level: String,

    /// Execution model that runs the pipeline stages: workqueue (one pool, every
    /// stage at equal priority), threaded (a thread per peer for its serial stages) or
    /// softirq (a higher-priority poller per core, as the kernel; for study).
    #[arg(long, value_name = "MODEL", default_value = "workqueue")]
    model: Model,

    /// Do not ask the TUN for checksum and segmentation offloads (IFF_VNET_HDR).
    #[arg(long)]
    no_offloads: bool,

    /// Crypt worker threads (default: one per online CPU).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_WORKERS as i64))]
    workers: Option<u16>,

    /// Name of the interface to create, 1 to 15 characters.
    #[arg(value_name = "IFNAME", value_parser = parse_ifname)]
    ifname: String,
}

fn parse_ifname(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() < 16
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}' is not a valid interface name (1-15 printable characters, no '/' or ':')"
        ))
    }
}

fn init_logging(cli: &Cli) {
    let level = match std::env::var("LOG_LEVEL").ok().as_deref() {
        Some("verbose" | "debug") => "debug".to_string(),
        Some("error") => "error".to_string(),
        Some("silent") => "off".to_string(),
        _ => cli.log_level.clone(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("WIRELANE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
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

/// Why the daemon is stopping.
enum Stop {
    Signal(i32),
    SocketRemoved,
    DeviceFailed(String),
}

fn wait_for_stop(sig: &OwnedFd, uapi: &listener::UapiListener, dev: &Interface) -> Stop {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sig.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: uapi.watch_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: dev.waker.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of three pollfds for the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) };
        if r < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            // SAFETY: signalfd_siginfo is plain data; read fills it from our signalfd.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let n = unsafe {
                libc::read(
                    sig.as_raw_fd(),
                    &mut info as *mut _ as *mut libc::c_void,
                    std::mem::size_of_val(&info),
                )
            };
            if n > 0 {
                return Stop::Signal(info.ssi_signo as i32);
            }
        }
        if fds[1].revents != 0 && uapi.removed() {
            return Stop::SocketRemoved;
        }
        if fds[2].revents != 0 {
            let why = dev.fatal.lock().map(|f| f.clone()).unwrap_or_default();
            return Stop::DeviceFailed(why.unwrap_or_else(|| "stopped".into()));
        }
    }
}

fn run(cli: &Cli, readiness: &mut daemonize::Readiness) -> Result<(), String> {
    let sig = signal_fd().map_err(|e| format!("cannot set up signal handling: {e}"))?;
    // Refuse before touching the interface if another process already serves it.
    listener::ensure_not_served(&cli.ifname).map_err(|e| e.to_string())?;
    let tun = listener::retry_while_exiting(|| Tun::create(&cli.ifname, !cli.no_offloads))
        .map_err(|e| format!("cannot create TUN interface '{}': {e}", cli.ifname))?;
    let sockets = Sockets::bind(0, 0).map_err(|e| format!("cannot bind UDP sockets: {e}"))?;
    let dev = Interface::new(Box::new(tun), sockets)
        .map_err(|e| format!("cannot create the interface: {e}"))?;
    let uapi = listener::UapiListener::bind(&cli.ifname)
        .map_err(|e| format!("cannot create UAPI socket: {e}"))?;
    // Setup is done: keep only what the UAPI may still need, before any thread exists.
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
    let workers = cli
        .workers
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runtime = Arc::new(
        Runtime::start(cli.model, workers).map_err(|e| format!("cannot start workers: {e}"))?,
    );
    runtime
        .serve(&dev)
        .map_err(|e| format!("cannot start the interface's readers: {e}"))?;
    let accept = uapi
        .serve(dev.clone(), runtime.clone())
        .map_err(|e| format!("cannot start UAPI server: {e}"))?;
    tracing::info!(
        interface = %dev.tun.name(),
        port = dev.sockets().port,
        workers,
        model = ?cli.model,
        socket = %listener::socket_path(&cli.ifname).display(),
        "wirelane is up"
    );
    readiness.ready();

    let stop = wait_for_stop(&sig, &uapi, &dev);
    match &stop {
        Stop::Signal(s) => tracing::info!(signal = s, "shutting down on signal"),
        Stop::SocketRemoved => tracing::info!("UAPI socket was removed; shutting down"),
        Stop::DeviceFailed(why) => tracing::info!(reason = %why, "shutting down"),
    }
    // The socket goes first: from here on a new daemon for this interface (a restart,
    // `wg-quick down; wg-quick up`) finds the name free, while the threads below stop.
    uapi.remove();
    runtime.stop();
    tracing::info!(stats = ?dev.stats.fields(), "final interface counters");
    let _ = accept.join();
    // The TUN interface disappears when its last descriptor closes with the device.
    drop(Arc::try_unwrap(dev).ok());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let detached = std::env::var_os(daemonize::READY_FD_ENV).is_some();
    if !cli.foreground && !detached {
        // Re-run ourselves in the background with the same arguments.
        let args: Vec<String> = std::env::args().skip(1).collect();
        let keep_stderr = std::env::var_os("WIRELANE_LOG").is_some()
            || std::env::var("LOG_LEVEL").is_ok_and(|l| l != "silent");
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
