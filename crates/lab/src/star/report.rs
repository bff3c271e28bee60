//! The star sweep: every (direction, N) cell against every implementation, repeats
//! interleaved (implementations alternate within a repeat, and the order rotates), one
//! JSON line per run, and a Markdown table of the medians: goodput against N (seed
//! 000's Fig. 8), cost per byte against the AEAD floor, loss and where it happened,
//! delay, memory and handshake time.

use super::table::{paired_table, table};
use super::{aead_floor, run_one, Shape, StarRecord, StarSpec, Way};
use crate::impls::Impl;
use crate::stats::median;
use crate::Result;
use std::io::Write;
use std::path::Path;

/// Runs the sweep, appending each record to `out` as it completes (and telling
/// `progress`), and returns all records.
pub fn sweep(
    impls: &[Impl],
    cells: &[StarSpec],
    repeats: usize,
    out: &Path,
    progress: &mut dyn FnMut(&StarRecord),
) -> Result<Vec<StarRecord>> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    let mut all = Vec::new();
    for repeat in 0..repeats {
        for spec in cells {
            // The AEAD floor, measured beside each cell's runs.
            let floor = aead_floor(spec.size);
            for k in 0..impls.len() {
                // Between runs: the runs so far are in the file already.
                crate::interrupt::check()?;
                let which = impls[(k + repeat) % impls.len()];
                let rec = run_one(which, spec, repeat, floor);
                writeln!(file, "{}", serde_json::to_string(&rec)?)?;
                progress(&rec);
                all.push(rec);
            }
        }
    }
    Ok(all)
}

/// Reads records written by [`sweep`].
pub fn load(path: &Path) -> Result<Vec<StarRecord>> {
    std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// `wirelane-lab star`: the sweep from the command line.
#[derive(clap::Args, Debug)]
pub struct StarArgs {
    /// Peer counts to sweep (comma-separated), each 1..=40000.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub peers: Vec<usize>,
    /// Directions (comma-separated): rx (peers → gateway, the gateway decrypts) and tx.
    #[arg(long, value_delimiter = ',', default_value = "rx")]
    pub direction: Vec<Way>,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "wirelane,wireguard-go,boringtun"
    )]
    pub implementations: Vec<String>,
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Length of each paced or transmit phase, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Inner packet size, bytes.
    #[arg(long, default_value_t = super::spec::DEFAULT_SIZE)]
    pub size: usize,
    /// Offered load per peer, Mbit/s of inner packets (seed 000 used 25); the total
    /// grows with N. Without it (or --offered-gbit) the generator sends unlimited.
    #[arg(long, conflicts_with = "offered_gbit")]
    pub per_peer_mbit: Option<f64>,
    /// Offered load over all peers, Gbit/s of inner packets, whatever N.
    #[arg(long)]
    pub offered_gbit: Option<f64>,
    /// Handshake initiations per second before the phase (0: all at once, a storm).
    #[arg(long, default_value_t = 2000.0)]
    pub handshake_rate: f64,
    /// Cap on the sealed traffic held in memory, MiB.
    #[arg(long, default_value_t = super::DEFAULT_SEALED_MAX_MIB)]
    pub sealed_max_mib: usize,
    /// All peers behind one outer address (as behind a NAT) instead of one each: the
    /// gateway's per-source handshake rate limit then applies to them together.
    #[arg(long)]
    pub shared_source: bool,
    /// Also configure this many peers that all initiate at once when the timed phase
    /// starts (a handshake storm during the traffic of the N); 0: none.
    #[arg(long, default_value_t = 0)]
    pub storm_peers: usize,
    /// Inner address families: ipv4, ipv6, or dual (every peer has both; even peers
    /// send IPv4, odd ones IPv6).
    #[arg(long, default_value_t = super::inner::Family::Ipv4)]
    pub inner: super::inner::Family,
    /// Where received packets end: socket (a sink that checks every packet's order,
    /// integrity and delay) or blackhole (a blackhole route: only counted, at the least
    /// cost to the kernel after the TUN write). Receive direction only.
    #[arg(long, default_value_t = super::sink::SinkKind::Socket)]
    pub sink: super::sink::SinkKind,
    /// Receive: the last this-many of the N peers are light, each sending
    /// --light-mbit one packet at a time from a sender of their own, while the others
    /// share the offered load (which must be paced); the light peers' one-way delay
    /// and loss are reported apart.
    #[arg(long, default_value_t = 0)]
    pub light_peers: usize,
    /// Each light peer's rate, Mbit/s of inner packets.
    #[arg(long, default_value_t = 1.0)]
    pub light_mbit: f64,
    /// Transmit: the session age at which the peers rekey, s (default: the
    /// whitepaper's 165 s for a receiving initiator).
    #[arg(long)]
    pub rekey_after_s: Option<f64>,
    /// Tunnels on the gateway to spread the peers over (comma-separated, each
    /// 1..=64 and at most N): peer i on tunnel i mod T, each tunnel with its own key
    /// and port. wirelane serves them from one process, the others from one each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub tunnels: Vec<usize>,
    /// Output directory (default: lab-results/star-<timestamp>).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// Runs `wirelane-lab star`: writes OUT/star.jsonl, OUT/star.md and OUT/star.html (the
/// charts against N), prints the table.
pub fn run_cli(a: &StarArgs) -> Result<()> {
    if !(1..=100).contains(&a.repeats) {
        return Err("--repeats must be 1..=100".into());
    }
    let impls: Vec<Impl> = a
        .implementations
        .iter()
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    let mut cells = Vec::new();
    for &way in &a.direction {
        for (&peers, &tunnels) in a
            .peers
            .iter()
            .flat_map(|p| a.tunnels.iter().map(move |t| (p, t)))
        {
            // Per-peer loads are the heavy peers'; the light ones have their own.
            let heavy = peers.saturating_sub(a.light_peers).max(1);
            let offered_pps = match (way, a.per_peer_mbit, a.offered_gbit) {
                (_, Some(m), _) => Some(m * 1e6 * heavy as f64 / (8.0 * a.size as f64)),
                (_, _, Some(g)) => Some(g * 1e9 / (8.0 * a.size as f64)),
                _ => None,
            };
            let spec = StarSpec {
                peers,
                way,
                size: a.size,
                offered_pps,
                seconds: a.seconds,
                handshake_rate: (a.handshake_rate > 0.0).then_some(a.handshake_rate),
                sealed_max_mib: a.sealed_max_mib,
                shared_source: a.shared_source,
                sample_every: 64,
                storm_peers: a.storm_peers,
                family: a.inner,
                sink: a.sink,
                light_peers: a.light_peers,
                light_mbit: a.light_mbit,
                rekey_after_s: a.rekey_after_s,
                tunnels,
            };
            spec.validate()?;
            spec.per_peer()?;
            cells.push(spec);
        }
    }
    let dir = a.out.clone().unwrap_or_else(|| {
        Path::new("lab-results").join(format!("star-{}", crate::record::now_rfc3339()))
    });
    std::fs::create_dir_all(&dir)?;
    let env = crate::record::collect_env(&impls);
    let total = cells.len() * impls.len() * a.repeats;
    let mut done = 0;
    let records = sweep(
        &impls,
        &cells,
        a.repeats,
        &dir.join("star.jsonl"),
        &mut |r| {
            done += 1;
            let s = r.spec.as_ref().expect("sweep records carry their spec");
            let what = match &r.error {
                Some(e) => format!("error: {e}"),
                None => format!(
                    "{:.2} Gbit/s, {} of {} delivered, handshakes {:.2} s{}{}{}{}",
                    r.goodput_bps / 1e9,
                    r.delivered,
                    r.sent + r.unsent,
                    r.handshake.to_all_s.unwrap_or(f64::NAN),
                    match r.rekeys {
                        0 => String::new(),
                        k => format!(", {k} rekeys"),
                    },
                    match r.answered {
                        0 => String::new(),
                        k => format!(", {k} sessions the gateway began"),
                    },
                    r.rss_growth_kib()
                        .map_or(String::new(), |k| format!(", RSS growth {k} KiB")),
                    match r.signatures.as_ref().map(|s| s.initiations_summary()) {
                        Some(s) if !s.is_empty() => format!(", gateway initiations: {s}"),
                        _ => String::new(),
                    },
                ),
            };
            eprintln!(
                "[{done}/{total}] {} {}: {what}",
                s.shape(),
                r.implementation
            );
        },
    )?;
    // The first implementation named is the baseline the others are paired with.
    let baseline = impls.first().map(|i| i.name()).unwrap_or_default();
    let md = table(&records, &env.cpu_model) + &paired_table(&records, &baseline);
    std::fs::write(dir.join("star.md"), &md)?;
    std::fs::write(
        dir.join("star.html"),
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>star:N</title>\
             <style>body{{font-family:sans-serif}}.charts{{display:flex;flex-wrap:wrap;gap:12px}}\
             </style></head><body><p>{} cores, {}; kernel {}; commit {}.</p>{}<pre>{}</pre></body></html>",
            env.cores,
            crate::report::esc(&env.cpu_model),
            crate::report::esc(&env.kernel),
            crate::report::esc(&env.commit),
            charts_html(&records),
            crate::report::esc(&md)
        ),
    )?;
    println!("{md}");
    println!("results: {}", dir.display());
    Ok(())
}

/// One line per implementation through its medians at each N, N on a log axis.
pub(crate) fn line_chart(
    title: &str,
    unit: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> String {
    use crate::report::{esc, svg_open, COLORS};
    use std::fmt::Write as _;
    let (w, h, left, right, top, bottom) = (640.0, 260.0, 60.0, 20.0, 28.0, 210.0);
    let ns: Vec<usize> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .collect();
    let (lo, hi) = (
        ns.iter().copied().min().unwrap_or(1).max(1) as f64,
        ns.iter().copied().max().unwrap_or(1).max(1) as f64,
    );
    let span = (hi.log10() - lo.log10()).max(1e-9);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |n: usize| left + (w - left - right) * ((n.max(1) as f64).log10() - lo.log10()) / span;
    let y = |v: f64| bottom - (bottom - top) * v / ymax;
    let mut s = svg_open(w, h, title, &format!("{title} ({unit})"), 16.0);
    let _ = write!(
        s,
        r#"<line x1="{left}" x2="{}" y1="{bottom}" y2="{bottom}" stroke="black"/><line x1="{left}" x2="{left}" y1="{top}" y2="{bottom}" stroke="black"/><text x="4" y="{}" font-size="11">{:.2}</text><text x="4" y="{bottom}" font-size="11">0</text>"#,
        w - right,
        top + 4.0,
        ymax / 1.1,
    );
    let mut ticks = ns.clone();
    ticks.sort_unstable();
    ticks.dedup();
    for n in ticks {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" font-size="11">N={n}</text>"#,
            x(n) - 10.0,
            bottom + 16.0
        );
    }
    for (i, (name, points)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|&(n, v)| format!("{:.1},{:.1}", x(n), y(v)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(n, v) in points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"><title>{} N={n}: {v:.3}</title></circle>"#,
                x(n),
                y(v),
                esc(name)
            );
        }
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="240" width="10" height="10" fill="{c}"/><text x="{:.1}" y="249" font-size="11">{}</text>"#,
            left + 150.0 * i as f64,
            left + 14.0 + 150.0 * i as f64,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// The charts against N (seed 000's Fig. 8 and its companions): per direction and
/// offered load, goodput, daemon CPU-seconds per GB and one-way delay p99, one line per
/// implementation through the medians.
pub fn charts_html(records: &[StarRecord]) -> String {
    // A group is a shape but for N; its lines run over N.
    let group_of = |s: &StarSpec| Shape {
        peers: 0,
        ..s.shape()
    };
    let mut groups: Vec<Shape> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for r in records {
        let Some(s) = &r.spec else { continue };
        if !groups.contains(&group_of(s)) {
            groups.push(group_of(s));
        }
        if !names.contains(&r.implementation) {
            names.push(r.implementation.clone());
        }
    }
    type Figure = fn(&StarRecord) -> Option<f64>;
    let figures: [(&str, &str, Figure); 3] = [
        ("goodput", "Gbit/s", |r| Some(r.goodput_bps / 1e9)),
        ("daemon CPU per GB", "CPU-s/GB", |r| r.cpu_s_per_gb),
        ("one-way delay p99", "ms", |r| {
            r.delay_p99_us.map(|d| d / 1e3)
        }),
    ];
    let mut out = String::new();
    for group in groups {
        let title = group.to_string().replace(" N=0", "");
        out.push_str(&format!("<h2>star:N, {title}</h2><div class=\"charts\">"));
        for (what, unit, f) in figures {
            let series: Vec<(String, Vec<(usize, f64)>)> = names
                .iter()
                .map(|name| {
                    let of = |n: Option<usize>| {
                        records.iter().filter(move |r| {
                            r.implementation == *name
                                && r.spec.as_ref().is_some_and(|s| {
                                    group_of(s) == group && n.is_none_or(|n| s.peers == n)
                                })
                        })
                    };
                    let mut ns: Vec<usize> = of(None)
                        .filter_map(|r| r.spec.as_ref().map(|s| s.peers))
                        .collect();
                    ns.sort_unstable();
                    ns.dedup();
                    let points = ns
                        .into_iter()
                        .filter_map(|n| {
                            let v: Vec<f64> = of(Some(n))
                                .filter(|r| r.error.is_none())
                                .filter_map(f)
                                .collect();
                            Some((n, median(&v)?))
                        })
                        .collect();
                    (name.clone(), points)
                })
                .filter(|(_, p): &(String, Vec<(usize, f64)>)| !p.is_empty())
                .collect();
            if !series.is_empty() {
                out.push_str(&line_chart(&format!("{what} against N"), unit, &series));
            }
        }
        out.push_str("</div>");
    }
    out
}
