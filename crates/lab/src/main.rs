//! `wirelane-lab`: run a measurement matrix, and report on its results.

use clap::{CommandFactory, Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use wirelane_lab::impls::Impl;
use wirelane_lab::matrix::Matrix;
use wirelane_lab::{record, report, run, summary, Result};

#[derive(Parser)]
#[command(
    name = "wirelane-lab",
    version,
    about = "Measure and compare WireGuard implementations in network namespaces"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the man page (man) or a shell completion script (complete-bash,
    /// complete-zsh); for packages.
    #[command(hide = true)]
    Generate {
        #[arg(value_parser = ["man", "complete-bash", "complete-zsh"])]
        kind: String,
    },
    /// Run every cell of MATRIX (a TOML file), interleaving implementations, and write
    /// one JSON line per run to OUT/results.jsonl plus OUT/summary.md.
    Run {
        matrix: PathBuf,
        /// Output directory (default: lab-results/<timestamp>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Override the matrix's seconds per cell.
        #[arg(long, value_name = "SECONDS")]
        duration: Option<f64>,
        /// Override the matrix's repeats.
        #[arg(long)]
        repeats: Option<usize>,
        /// Only these implementations (comma-separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Run these implementations instead of the matrix's (comma-separated), e.g.
        /// wirelane:workqueue,wirelane:threaded,wirelane:softirq or, with --build,
        /// wirelane,wirelane@base. The first is the baseline.
        #[arg(long, value_delimiter = ',')]
        implementations: Vec<String>,
        /// Register another wirelane binary as wirelane@NAME (repeatable), for A/B runs
        /// of two builds interleaved in one run.
        #[arg(long, value_name = "NAME=PATH")]
        build: Vec<String>,
    },
    /// Write DIR/report.html (charts and history) and DIR/summary.md from DIR's
    /// results, with earlier result directories as history.
    Report {
        dir: PathBuf,
        /// Earlier result directories to include in the history table.
        #[arg(long)]
        history: Vec<PathBuf>,
    },
    /// Time `wg setconf` of COUNT peers into each implementation and measure the
    /// resident memory each idle peer costs (interleaved repeats).
    Peers {
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "wirelane,wireguard-go,boringtun"
        )]
        implementations: Vec<String>,
    },
    /// Compare the lab's single-stream TCP goodput with iperf3's on the same tunnel
    /// (interleaved repeats; the medians should agree within 15%).
    Crosscheck {
        /// Implementation carrying the traffic.
        #[arg(long, default_value = "wirelane")]
        implementation: String,
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// The scheduling stress run, longer than the test's: each model with few workers,
    /// many peers and traffic both ways through the real runtime over in-memory ports,
    /// with random yields and sleeps; fails on any stall, loss or misdelivery, and
    /// reports how long the slowest round took to drain once its packets were in.
    Wakeup {
        /// Models to run (comma-separated).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "workqueue,threaded,softirq"
        )]
        models: Vec<String>,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value_t = 64)]
        peers: usize,
        #[arg(long, default_value_t = 1000)]
        rounds: usize,
        /// Packets each way per peer per round (at most 512: the per-peer queues hold
        /// 1,024).
        #[arg(long, default_value_t = 64)]
        per_round: usize,
        /// Fail if any round takes longer than this to drain once its last packet is
        /// in (the watchdog of design.md §4), in milliseconds.
        #[arg(long, default_value_t = 1000)]
        watchdog_ms: u64,
        /// Fail on packets the daemon dropped and counted too (a reader that waited
        /// 100 ms for room under overload gives up). Without it they are reported;
        /// a packet lost without a count, misdelivered or left queued fails either way.
        #[arg(long)]
        strict: bool,
    },
    /// Capture real traffic (outer datagrams at the relay, inner packets with their
    /// virtio-net header at the tunnel interface) as seed inputs for the fuzz targets.
    Capture {
        /// Seed directory; one subdirectory per fuzz target is written.
        #[arg(long, default_value = "fuzz/seeds")]
        out: PathBuf,
        /// Also frame the Noise IKpsk2 vector from this directory's noise_ikpsk2.txt.
        #[arg(long, value_name = "DIR")]
        vectors: Option<PathBuf>,
        #[arg(long, value_delimiter = ',', default_value = "wirelane,wireguard-go")]
        implementations: Vec<String>,
    },
    /// Send a handshake flood at a WireGuard responder from this namespace: spoofed
    /// (valid mac1, random sources from --source), junk (bad mac1) or cookie (one real
    /// source that answers cookie replies). Bounded by --seconds.
    Flood {
        /// Responder address, IPv4:port.
        #[arg(value_parser = wirelane_lab::flood::parse_target)]
        target: std::net::SocketAddrV4,
        /// Responder's public key (base64, as `wg` prints it, or 64 hex digits).
        #[arg(long)]
        public_key: String,
        #[arg(long, default_value = "spoofed")]
        kind: wirelane_lab::flood::FloodKind,
        /// Spoofed: source prefix. Cookie: the address to send from.
        #[arg(long, default_value = "10.200.0.0/16")]
        source: String,
        #[arg(long, default_value_t = 10.0, value_parser = seconds_in_range)]
        seconds: f64,
        /// Initiations per second for spoofed and junk floods (default: maximum).
        #[arg(long)]
        rate: Option<u64>,
    },
    /// The gateway at scale (star:N): one gateway under test, N peers emulated on the
    /// protocol library with their traffic sealed before the timed phase; sweeps N ×
    /// direction × implementation with interleaved repeats.
    Star(wirelane_lab::star::report::StarArgs),
    /// The kernel's own cost of a gateway's sends, with no tunnel: one thread sends
    /// sealed-size datagrams over a veth to N sockets, in GSO sends of K to each in turn
    /// (by default: N=1) or one per destination in `sendmmsg` calls; prints its
    /// CPU-seconds per GB, the floor under any gateway's transmit cost at N peers and K
    /// packets per send. Repeats are interleaved.
    SendFloor {
        /// Destination counts (comma-separated), each 1..=40000.
        #[arg(long, value_delimiter = ',', default_value = "1,1000")]
        peers: Vec<usize>,
        /// Inner packet size, bytes (the datagram is its sealed size).
        #[arg(long, default_value_t = 1420)]
        size: usize,
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Datagrams per `sendmmsg` with many destinations (1: one `sendmsg` each).
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Datagrams per GSO send to each destination in turn, as a flush that found
        /// that many packets of its peer sends them (default: as many as fit at one
        /// destination, 1 at many; 1 means `sendmmsg` calls of `--batch`).
        #[arg(long)]
        segments: Option<usize>,
        /// Paces the sender to this many Gbit/s of datagrams (default: as fast as it
        /// can); a floor holds only where the receivers took every datagram.
        #[arg(long)]
        offered_gbit: Option<f64>,
    },
    /// A discrete-event model of the pipeline on many cores and peers (MODEL.md): run
    /// it, calibrate it from star runs, validate it, reproduce seed 000, predict.
    Model {
        #[command(subcommand)]
        cmd: wirelane_lab::model::cli::ModelCmd,
    },
    /// Robustness scenarios against a wirelane tunnel in fresh namespaces, with figures.
    Robust {
        #[command(subcommand)]
        scenario: Scenario,
    },
}

#[derive(Subcommand)]
enum Scenario {
    /// TCP with and without a spoofed handshake flood (interleaved), the rate limit,
    /// junk costing no Diffie-Hellman, under-load recovery, and a new peer joining.
    Flood {
        #[arg(long, default_value_t = 3.0, value_parser = seconds_in_range)]
        seconds: f64,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Spoofed initiations per second (default: as fast as possible).
        #[arg(long)]
        rate: Option<u64>,
    },
    /// The spoofed flood alone at full rate: the share answered, kernel drops at each
    /// socket, and the responder's busy threads.
    FloodAlone {
        #[arg(long, default_value_t = 8.0, value_parser = seconds_in_range)]
        seconds: f64,
    },
    /// Replay a captured transport-data message and initiation TIMES times each.
    Replay {
        #[arg(long, default_value_t = 10_000)]
        times: usize,
    },
    /// Faults on the outer path through the relay: 20% loss (handshakes, TCP), 100%
    /// duplication, 25% reorder, 1% corruption (paced, content-checked UDP) and a link
    /// down for DOWN seconds.
    Faults {
        /// Length of each UDP and TCP run.
        #[arg(long, default_value_t = 5.0, value_parser = seconds_in_range)]
        seconds: f64,
        #[arg(long, default_value_t = 30.0, value_parser = seconds_in_range)]
        down: f64,
    },
    /// Garbage, forged and replayed messages from a new address must not move the
    /// peer's endpoint; authenticated data from a new address must.
    Roaming,
    /// Bulk TCP while B's configuration churns (peers added and removed, keys and
    /// preshared keys replaced, prefixes covering the tunnel moved between decoys):
    /// memory, descriptors, threads and misrouted packets over time.
    Churn {
        #[arg(long, default_value_t = 600.0, value_parser = seconds_in_range)]
        seconds: f64,
        /// Length of each TCP run; the daemon is sampled after each.
        #[arg(long, default_value_t = 10.0, value_parser = seconds_in_range)]
        chunk: f64,
    },
    /// A paced UDP stream long enough for several rekeys (one per 120 s): handshakes
    /// completed, and loss, duplicates, reordering and corruption across them.
    Rekey {
        #[arg(long, default_value_t = 540.0, value_parser = seconds_in_range)]
        seconds: f64,
        #[arg(long, default_value_t = 2_000)]
        pps: u64,
    },
    /// Interface down/up cycles: descriptors, threads and memory before and after.
    Updown {
        #[arg(long, default_value_t = 500)]
        cycles: usize,
    },
}

fn seconds_in_range(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}': expected seconds between 0.1 and 3600")),
    }
}

fn flood_cmd(
    target: std::net::SocketAddrV4,
    public_key: &str,
    kind: wirelane_lab::flood::FloodKind,
    source: &str,
    seconds: f64,
    rate: Option<u64>,
) -> Result<()> {
    let key = wirelane_proto::parse_hex_key(public_key)
        .or_else(|| wirelane_proto::parse_base64_key(public_key))
        .ok_or("--public-key: expected a base64 or hex WireGuard key")?;
    let (addr, len) = source.split_once('/').unwrap_or((source, "32"));
    let source = (
        addr.parse()
            .map_err(|_| format!("--source: '{addr}' is not an IPv4 address"))?,
        len.parse::<u8>()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or("--source: bad prefix length")?,
    );
    let spec = wirelane_lab::flood::FloodSpec {
        kind,
        target,
        responder_public: key,
        source,
        duration: std::time::Duration::from_secs_f64(seconds),
        rate,
    };
    let r = wirelane_lab::flood::run(&spec, wirelane_lab::interrupt::flag())?;
    println!(
        "sent {} initiations in {:.2} s ({:.0}/s); cookie replies taken: {}",
        r.sent,
        r.seconds,
        r.sent as f64 / r.seconds.max(1e-9),
        r.cookie_replies
    );
    Ok(())
}

fn capture(out: &Path, vectors: Option<&Path>, impls: &[String]) -> Result<()> {
    let impls = impls
        .iter()
        .map(|s| s.parse::<Impl>())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let w = wirelane_lab::capture::run(&impls, vectors, out)?;
    println!(
        "seeds written to {}: udp_datagram {}, handshake {}, offload {}, inner_ip {}",
        out.display(),
        w.udp_datagram,
        w.handshake,
        w.offload,
        w.inner_ip
    );
    Ok(())
}

/// Commands that only compute and print end quietly when their reader goes away
/// (`| head`), as other Unix tools do, instead of panicking in `println!`. Commands
/// that own namespaces or daemons keep SIGPIPE ignored so that their cleanup runs.
fn quiet_on_broken_pipe() {
    // SAFETY: restoring a signal's default disposition has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn progress(done: usize, total: usize, line: &str) {
    let width = 30;
    let filled = done * width / total.max(1);
    eprintln!(
        "[{}{}] {done}/{total} {line}",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
}

/// What `run` takes beside the matrix.
struct RunOptions<'a> {
    out: Option<PathBuf>,
    duration: Option<f64>,
    repeats: Option<usize>,
    only: &'a [String],
    implementations: &'a [String],
    builds: &'a [String],
}

fn run_matrix(path: &PathBuf, o: RunOptions<'_>) -> Result<()> {
    let RunOptions {
        out,
        duration,
        repeats,
        only,
        implementations,
        builds,
    } = o;
    for b in builds {
        wirelane_lab::impls::register_build(b)?;
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut m = Matrix::parse(&text)?;
    if !implementations.is_empty() {
        m.implementations = implementations
            .iter()
            .map(|s| s.parse())
            .collect::<std::result::Result<_, _>>()?;
        m.baseline = m.implementations[0];
    }
    if let Some(d) = duration {
        if !(0.5..=600.0).contains(&d) {
            return Err("--duration must be 0.5..=600 seconds".into());
        }
        m.duration = std::time::Duration::from_secs_f64(d);
        m.check_star_cells()?;
    }
    if let Some(r) = repeats {
        if !(1..=100).contains(&r) {
            return Err("--repeats must be 1..=100".into());
        }
        m.repeats = r;
    }
    if !only.is_empty() {
        let keep: Vec<_> = only
            .iter()
            .map(|s| s.parse())
            .collect::<std::result::Result<_, _>>()?;
        m.implementations.retain(|i| keep.contains(i));
        if m.implementations.is_empty() {
            return Err("--only leaves no implementation".into());
        }
        if !m.implementations.contains(&m.baseline) {
            eprintln!(
                "--only leaves out the baseline {}; ratios are against {}",
                m.baseline.name(),
                m.implementations[0].name()
            );
            m.baseline = m.implementations[0];
        }
    }
    let mut impls = Vec::new();
    for i in &m.implementations {
        match i.available() {
            Ok(()) => impls.push(*i),
            Err(why) => eprintln!("skipping {}: {why}", i.name()),
        }
    }
    m.implementations = impls;
    if m.implementations.is_empty() {
        return Err("no implementation in the matrix is available here".into());
    }
    let env = record::collect_env(&m.implementations);
    let set = format!("{} {}", record::now_rfc3339(), env.commit);
    let out = out.unwrap_or_else(|| {
        PathBuf::from("lab-results").join(record::now_rfc3339().replace(':', "-"))
    });
    let named = |e: std::io::Error| format!("{}: {e}", out.display());
    std::fs::create_dir_all(&out).map_err(named)?;
    let mut results = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join("results.jsonl"))
        .map_err(named)?;
    let schedule = m.schedule();
    let mut records = Vec::new();
    for (k, r) in schedule.iter().enumerate() {
        if wirelane_lab::interrupt::requested() {
            eprintln!(
                "interrupted: {} of {} runs done; partial results kept",
                k,
                schedule.len()
            );
            break;
        }
        let rec = run::execute(&m, r, &env, &set);
        let fig = match (&rec.error, summary::metrics_for(&rec).first()) {
            (Some(e), _) => format!("error: {e}"),
            (None, Some(mt)) => (mt.extract)(&rec).map_or("no data".into(), |v| {
                format!("{} {:.3} {}", mt.name, v * mt.scale, mt.unit)
            }),
            _ => String::new(),
        };
        progress(
            k + 1,
            schedule.len(),
            &format!(
                "{} | {} | repeat {} | {fig}",
                rec.cell_id,
                rec.implementation,
                r.repeat + 1
            ),
        );
        writeln!(results, "{}", serde_json::to_string(&rec)?)?;
        records.push(rec);
    }
    let order: Vec<String> = m
        .implementations
        .iter()
        .map(|i| i.name().to_string())
        .collect();
    let md = summary::markdown(&records, &m.baseline.name(), &order);
    std::fs::write(out.join("summary.md"), &md)?;
    println!("{md}");
    println!("results: {}", out.join("results.jsonl").display());
    if !records.is_empty() && records.iter().all(|r| r.error.is_some()) {
        return Err(format!("every one of the {} runs failed", records.len()).into());
    }
    Ok(())
}

fn write_report(dir: &Path, history: &[PathBuf]) -> Result<()> {
    let mut dirs = history.to_vec();
    dirs.push(dir.to_path_buf());
    let sets = report::load_sets(&dirs)?;
    // The summary is DIR's own newest set, whatever the history holds.
    let own = report::load_sets(&[dir.to_path_buf()])?;
    let newest = own
        .values()
        .next_back()
        .ok_or_else(|| format!("{}: no results", dir.display()))?;
    let baseline = newest
        .first()
        .map(|r| r.baseline.clone())
        .unwrap_or_default();
    let html = report::html(&sets, &baseline);
    std::fs::write(dir.join("report.html"), html)?;
    let md = summary::markdown(newest, &baseline, &report::impl_order(newest));
    std::fs::write(dir.join("summary.md"), &md)?;
    println!("{md}");
    println!("report: {}", dir.join("report.html").display());
    Ok(())
}

fn peers(count: usize, repeats: usize, names: &[String]) -> Result<()> {
    if !(1..=1_000_000).contains(&count) || !(1..=20).contains(&repeats) {
        return Err("--count must be 1..=1000000 and --repeats 1..=20".into());
    }
    let impls: Vec<_> = names
        .iter()
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    let r = wirelane_lab::peers::run(&impls, count, repeats)?;
    println!("{}", wirelane_lab::peers::table(&r, count));
    Ok(())
}

fn crosscheck(which: &str, secs: f64, repeats: usize) -> Result<()> {
    if !(0.5..=60.0).contains(&secs) || !(1..=20).contains(&repeats) {
        return Err("--seconds must be 0.5..=60 and --repeats 1..=20".into());
    }
    let m = wirelane_lab::crosscheck::meter(which.parse()?, secs)?;
    println!(
        "one transfer: the lab read {} bytes, the receiving interface took {} ({:.1}% \
         headers and retransmissions; {} segments retransmitted)",
        m.lab_bytes,
        m.interface_bytes,
        (1.0 - m.ratio()) * 100.0,
        m.retransmits
    );
    let c = wirelane_lab::crosscheck::run(which.parse()?, secs, repeats)?;
    let g = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.3}", x / 1e9))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("lab    Gbit/s: {}", g(&c.lab_bps));
    println!("iperf3 Gbit/s: {}", g(&c.iperf3_bps));
    println!("medians differ by {:.1}%", c.difference() * 100.0);
    if c.difference() > 0.15 {
        return Err("the lab and iperf3 disagree by more than 15%".into());
    }
    Ok(())
}

fn wakeup(
    models: &[String],
    workers: usize,
    peers: usize,
    rounds: usize,
    per_round: usize,
    watchdog: std::time::Duration,
    strict: bool,
) -> Result<()> {
    use wirelane_dataplane::memory::stress::{run, Stress};
    if !(1..=64).contains(&workers)
        || !(1..=4096).contains(&peers)
        || !(1..=1_000_000).contains(&rounds)
        || !(1..=512).contains(&per_round)
    {
        return Err(
            "--workers 1..=64, --peers 1..=4096, --rounds 1..=1000000, --per-round 1..=512".into(),
        );
    }
    for m in models {
        let model = m.parse()?;
        let started = std::time::Instant::now();
        let o = run(Stress {
            model,
            workers,
            peers,
            rounds,
            per_round,
            stall: std::time::Duration::from_secs(10),
            allow_counted_drops: !strict,
        })?;
        println!(
            "{model}: {} packets in {:.1} s, no stall, none lost uncounted; {} dropped and \
             counted under overload {:?}; slowest round drained {:.1} ms after its last \
             packet went in; {} serial invocations at the gateway",
            o.packets,
            started.elapsed().as_secs_f64(),
            o.counted_drops,
            o.drops_by_reason,
            o.slowest_drain.as_secs_f64() * 1e3,
            o.invocations
        );
        if o.slowest_drain > watchdog {
            return Err(format!(
                "{model}: a round took {:.1} ms to drain, over the {} ms watchdog",
                o.slowest_drain.as_secs_f64() * 1e3,
                watchdog.as_millis()
            )
            .into());
        }
    }
    Ok(())
}

/// Writes what `generate KIND` asks for to standard output.
fn generate(kind: &str) -> Result<()> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    match kind {
        "man" => clap_mangen::Man::new(cmd).section("1").render(&mut out)?,
        shell => {
            let shell = match shell {
                "complete-zsh" => clap_complete::Shell::Zsh,
                _ => clap_complete::Shell::Bash,
            };
            clap_complete::generate(shell, &mut cmd, "wirelane-lab", &mut out);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Commands that only compute (model, generate) keep the default: a signal ends
    // them, with nothing to clean up.
    if !matches!(cli.cmd, Cmd::Generate { .. } | Cmd::Model { .. }) {
        wirelane_lab::interrupt::install();
    }
    if let Err(e) = wirelane_lab::impls::check_env_builds() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let r = match &cli.cmd {
        Cmd::Generate { kind } => {
            quiet_on_broken_pipe();
            generate(kind)
        }
        Cmd::Star(a) => wirelane_lab::star::report::run_cli(a),
        Cmd::SendFloor {
            peers,
            size,
            seconds,
            repeats,
            batch,
            segments,
            offered_gbit,
        } => send_floor(
            peers,
            *size,
            *seconds,
            *repeats,
            *batch,
            *segments,
            *offered_gbit,
        ),
        Cmd::Model { cmd } => {
            quiet_on_broken_pipe();
            wirelane_lab::model::cli::run_cli(cmd)
        }
        Cmd::Run {
            matrix,
            out,
            duration,
            repeats,
            only,
            implementations,
            build,
        } => run_matrix(
            matrix,
            RunOptions {
                out: out.clone(),
                duration: *duration,
                repeats: *repeats,
                only,
                implementations,
                builds: build,
            },
        ),
        Cmd::Report { dir, history } => write_report(dir, history),
        Cmd::Peers {
            count,
            repeats,
            implementations,
        } => peers(*count, *repeats, implementations),
        Cmd::Crosscheck {
            implementation,
            seconds,
            repeats,
        } => crosscheck(implementation, *seconds, *repeats),
        Cmd::Wakeup {
            models,
            workers,
            peers,
            rounds,
            per_round,
            watchdog_ms,
            strict,
        } => wakeup(
            models,
            *workers,
            *peers,
            *rounds,
            *per_round,
            std::time::Duration::from_millis(*watchdog_ms),
            *strict,
        ),
        Cmd::Capture {
            out,
            vectors,
            implementations,
        } => capture(out, vectors.as_deref(), implementations),
        Cmd::Flood {
            target,
            public_key,
            kind,
            source,
            seconds,
            rate,
        } => flood_cmd(*target, public_key, *kind, source, *seconds, *rate),
        Cmd::Robust { scenario } => match scenario {
            Scenario::Flood {
                seconds,
                repeats,
                rate,
            } => wirelane_lab::robust::flood_scenario(*seconds, *repeats, *rate)
                .map(|o| wirelane_lab::robust::print_flood(&o)),
            Scenario::FloodAlone { seconds } => {
                wirelane_lab::robust::flood_alone_scenario(*seconds)
                    .map(|o| wirelane_lab::robust::print_flood_alone(&o))
            }
            Scenario::Replay { times } => wirelane_lab::robust::replay_scenario(*times)
                .map(|o| wirelane_lab::robust::print_replay(&o)),
            Scenario::Faults { seconds, down } => wirelane_lab::faults::all(
                Duration::from_secs_f64(*seconds),
                Duration::from_secs_f64(*down),
            )
            .map(|f| wirelane_lab::faults::print(&f)),
            Scenario::Roaming => wirelane_lab::faults::roaming_scenario()
                .map(|o| wirelane_lab::faults::print_roaming(&o)),
            Scenario::Churn { seconds, chunk } => wirelane_lab::churn::churn_scenario(
                Duration::from_secs_f64(*seconds),
                Duration::from_secs_f64(*chunk),
            )
            .map(|o| wirelane_lab::churn::print_churn(&o)),
            Scenario::Rekey { seconds, pps } => {
                wirelane_lab::rekey::rekey_scenario(Duration::from_secs_f64(*seconds), *pps)
                    .map(|o| wirelane_lab::rekey::print_rekey(&o))
            }
            Scenario::Updown { cycles } => wirelane_lab::churn::updown_scenario(*cycles)
                .map(|o| wirelane_lab::churn::print_updown(&o)),
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wirelane-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn send_floor(
    peers: &[usize],
    size: usize,
    seconds: f64,
    repeats: usize,
    batch: usize,
    segments: Option<usize>,
    gbit: Option<f64>,
) -> Result<()> {
    use wirelane_lab::star::send_floor::{measure, Floor};
    if !(1..=100).contains(&repeats) {
        return Err(format!("repeats must be 1..=100, not {repeats}").into());
    }
    let mut runs: Vec<Vec<Floor>> = vec![Vec::new(); peers.len()];
    for r in 0..repeats {
        for (i, &n) in peers.iter().enumerate() {
            wirelane_lab::interrupt::check()?;
            let f = measure(n, size, seconds, batch, segments, gbit)?;
            eprintln!(
                "[{}/{}] N={n}: {:.2} Gbit/s, {:.2} CPU-s/GB, {} of {} received",
                r * peers.len() + i + 1,
                repeats * peers.len(),
                f.gbit_per_s,
                f.cpu_s_per_gb,
                f.received,
                f.sent
            );
            println!("{}", serde_json::to_string(&f)?);
            runs[i].push(f);
        }
    }
    let median = |v: &[Floor], f: fn(&Floor) -> f64| {
        let x: Vec<f64> = v.iter().map(f).collect();
        wirelane_lab::stats::median(&x).unwrap_or(f64::NAN)
    };
    let cpu = wirelane_lab::record::cpu_model();
    eprintln!("\nSend floor, medians of {repeats}; CPU: {cpu}\n");
    eprintln!(
        "| destinations | datagrams per call | datagram bytes | Gbit/s | sender CPU-s per GB | received % |"
    );
    eprintln!("|---|---|---|---|---|---|");
    for (n, v) in peers.iter().zip(&runs) {
        eprintln!(
            "| {n} | {} | {} | {:.2} | {:.2} | {:.1} |",
            match v[0].segments {
                1 => batch.to_string(),
                k => format!("GSO of {k}"),
            },
            v[0].datagram,
            median(v, |f| f.gbit_per_s),
            median(v, |f| f.cpu_s_per_gb),
            median(v, |f| 100.0 * f.received as f64 / f.sent.max(1) as f64)
        );
    }
    Ok(())
}
