//! Executes one run: builds the testbed, brings the implementation up, warms the
//! tunnel, measures the workload with CPU, RSS and (where available) cycle counts, and
//! tears everything down again.

use crate::cpu;
use crate::impls::{Impl, Tunnel};
use crate::matrix::{Cell, Direction, Load, Matrix, Run};
use crate::record::{CpuReport, Env, RunRecord, SCHEMA};
use crate::signatures;
use crate::topology::Testbed;
use crate::workload::{rr, tcp, udp};
use crate::Result;
use std::time::{Duration, Instant};

pub fn execute(m: &Matrix, run: &Run, env: &Env, set: &str) -> RunRecord {
    let cell = m.cells[run.cell].clone();
    let mut rec = RunRecord {
        schema: SCHEMA,
        set: set.to_string(),
        timestamp: crate::record::now_rfc3339(),
        env: env.clone(),
        matrix: m.name.clone(),
        baseline: m.baseline.name().to_string(),
        cell_id: cell.id(),
        cell: cell.clone(),
        implementation: run.implementation.name().to_string(),
        version: env
            .versions
            .get(&run.implementation.name())
            .cloned()
            .unwrap_or_default(),
        repeat: run.repeat,
        seconds: m.duration.as_secs_f64(),
        error: None,
        tcp: Vec::new(),
        udp: None,
        latency: None,
        cpu: CpuReport::default(),
        peak_rss_kib: Vec::new(),
        cycles_per_byte: None,
        relay: Vec::new(),
        signatures: Vec::new(),
        daemon_threads: 0,
        star: None,
    };
    if let Some(spec) = cell.star_spec(m.duration.as_secs_f64()) {
        let floor = crate::star::aead_floor(spec.size);
        let s = crate::star::run_one(run.implementation, &spec, run.repeat, floor);
        rec.error = s.error.clone();
        rec.seconds = s.seconds;
        rec.cpu.daemon_s = s.daemon_cpu_s;
        rec.peak_rss_kib = s.peak_rss_kib.into_iter().collect();
        rec.signatures = s.signatures.iter().cloned().collect();
        rec.star = Some(s);
        return rec;
    }
    if let Err(e) = measure(run.implementation, &cell, m.duration, &mut rec) {
        rec.error = Some(e.to_string());
    }
    rec
}

/// Lab process CPU seconds (user + system), including threads that already exited.
fn self_cpu_s() -> f64 {
    // SAFETY: rusage is plain data filled by getrusage.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// Starts `perf stat` for system-wide cycles over `dur`, if perf works here.
fn start_cycles(dur: Duration) -> Option<std::process::Child> {
    crate::impls::find_tool("perf")?;
    std::process::Command::new("perf")
        .args(["stat", "-a", "-x", ",", "-e", "cycles", "--", "sleep"])
        .arg(format!("{:.3}", dur.as_secs_f64()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()
}

fn finish_cycles(child: Option<std::process::Child>) -> Option<f64> {
    let out = child?.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .find(|l| l.contains("cycles"))?
        .split(',')
        .next()?
        .trim()
        .parse()
        .ok()
}

fn measure(which: Impl, cell: &Cell, dur: Duration, rec: &mut RunRecord) -> Result<()> {
    if which == Impl::None && !cell.impairment().is_none() {
        return Err("not applicable: impairments act on a tunnel's outer UDP path".into());
    }
    let bed = Testbed::build(cell.topology(), cell.impairment())?;
    if let Cell::Rr { ecn: true, .. } = cell {
        for h in &bed.hosts {
            h.ns.run("sysctl -qw net.ipv4.tcp_ecn=1")?;
        }
    }
    let tun = Tunnel::up(which, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    let (addr_a, addr_b) = (tun.addr_a, tun.addr_b);

    // Warm up: complete the handshake before anything is timed.
    let warm = rr::run(rr::Proto::Udp, &a, &b, addr_b, Duration::from_millis(800))?;
    if warm.transactions == 0 {
        return Err("tunnel did not come up (no reply during warm-up)".into());
    }

    let hosts = tun.pids_by_host();
    let pids: Vec<(&str, u32)> = ["a", "b"]
        .into_iter()
        .zip(&hosts)
        .flat_map(|(side, ps)| ps.iter().map(move |&p| (side, p)))
        .collect();
    // wirelane's own counters, read around the workload like everything else: each
    // interface's, host A's tunnel ends first.
    let per_host = tun.pairs.len();
    let sig_ends: Vec<(String, String)> = if which.is_wirelane() {
        tun.daemons
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    d.ifname.clone(),
                    if i < per_host { "a" } else { "b" }.into(),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    let sigs_before: Vec<_> = sig_ends
        .iter()
        .map(|(i, _)| signatures::snapshot(i).unwrap_or_default())
        .collect();
    let threads_before: Vec<_> = pids
        .iter()
        .map(|&(_, p)| cpu::read_threads_and_ended(p))
        .collect();
    let cores_before = cpu::read_cores();
    let self_before = self_cpu_s();
    let apps_before = cpu::finished_workload_threads();
    let relay_before: Vec<_> = bed
        .relay
        .iter()
        .flat_map(|r| [r.a_to_b.snapshot(), r.b_to_a.snapshot()])
        .collect();
    let cycles = start_cycles(dur);
    let started = Instant::now();

    match *cell {
        Cell::Tcp {
            streams, direction, ..
        } => {
            // Every tunnel's transfer at once (one for pair), and both ways for Both.
            let mut flows = Vec::new();
            for &(ia, ib) in &tun.pairs {
                if direction != Direction::BToA {
                    flows.push((a.clone(), b.clone(), ib));
                }
                if direction != Direction::AToB {
                    flows.push((b.clone(), a.clone(), ia));
                }
            }
            let handles: Vec<_> = flows
                .into_iter()
                .map(|(src, dst, addr)| {
                    std::thread::spawn(move || tcp::bulk(&src, &dst, addr, streams, dur))
                })
                .collect();
            rec.tcp = handles
                .into_iter()
                .map(|h| h.join().map_err(|_| "a transfer panicked")?)
                .collect::<Result<_>>()?;
        }
        Cell::Udp {
            size,
            pps,
            direction,
            ..
        } => {
            rec.udp = Some(match direction {
                Direction::BToA => udp::stream(&b, &a, addr_a, size, pps, dur)?,
                _ => udp::stream(&a, &b, addr_b, size, pps, dur)?,
            });
        }
        Cell::Rr {
            proto,
            load,
            bulk_streams,
            bulk_direction,
            ..
        } => {
            let bulk = (load == Load::Bulk).then(|| {
                let (src, dst, to) = match bulk_direction {
                    Direction::BToA => (b.clone(), a.clone(), addr_a),
                    _ => (a.clone(), b.clone(), addr_b),
                };
                std::thread::spawn(move || {
                    let dur = dur + Duration::from_millis(300);
                    tcp::bulk(&src, &dst, to, bulk_streams, dur)
                })
            });
            rec.latency = Some(rr::run(proto, &a, &b, addr_b, dur)?);
            if let Some(h) = bulk {
                rec.tcp = vec![h.join().map_err(|_| "background bulk panicked")??];
            }
        }
        Cell::Star { .. } => return Err("star:N cells run in crate::star".into()),
    }

    let wall = started.elapsed().as_secs_f64();
    rec.seconds = wall;
    for ((ifname, side), before) in sig_ends.iter().zip(&sigs_before) {
        if let Ok(after) = signatures::snapshot(ifname) {
            rec.signatures
                .push(signatures::Signatures::between(side, before, &after));
        }
    }
    let cores_after = cpu::read_cores();
    let self_s = self_cpu_s() - self_before;
    let apps = cpu::finished_workload_threads();
    let tick = cpu::ticks_per_second();
    let busy_core_s: f64 = cores_before
        .iter()
        .zip(&cores_after)
        .map(|(b, a)| {
            // Stolen time is another guest's: see `CoreSplit::steal`.
            let busy = |c: &cpu::CoreTicks| c.user + c.nice + c.system + c.irq + c.softirq;
            busy(a).saturating_sub(busy(b)) as f64 / tick
        })
        .sum();
    let mut threads = Vec::new();
    for (&(side, pid), before) in pids.iter().zip(&threads_before) {
        let after = cpu::read_threads_and_ended(pid);
        threads.extend(cpu::thread_deltas(
            &format!("{}:{side}", which.name()),
            before,
            &after,
        ));
    }
    // One figure per host, its processes' peaks summed: wireguard-go and boringtun
    // run a process per tunnel where wirelane serves every tunnel from one, so a
    // single process's peak would compare one tunnel's memory with T tunnels'.
    // A host with no daemon process (kernel WireGuard, none) has no figure, not 0.
    rec.peak_rss_kib = hosts
        .iter()
        .filter_map(|ps| {
            let peaks: Vec<u64> = ps.iter().filter_map(|&p| cpu::peak_rss_kib(p)).collect();
            (!peaks.is_empty()).then(|| peaks.iter().sum())
        })
        .collect();
    let daemon_s: f64 = threads.iter().map(|t| t.cpu_s).sum();
    rec.daemon_threads = pids.iter().map(|&(_, p)| cpu::read_threads(p).len()).sum();
    let thread_s = daemon_s + self_s;
    rec.cpu = CpuReport {
        cores: cpu::core_splits(&cores_before, &cores_after),
        threads,
        busy_core_s,
        thread_s,
        daemon_s,
        apps_s: apps.run_ns.saturating_sub(apps_before.run_ns) as f64 / 1e9,
        apps_wait_s: apps.wait_ns.saturating_sub(apps_before.wait_ns) as f64 / 1e9,
        disagree: (busy_core_s - thread_s).abs() > (0.2 * busy_core_s).max(0.05),
    };
    let bytes = rec.delivered_bytes();
    if let Some(c) = finish_cycles(cycles) {
        if bytes > 0 {
            rec.cycles_per_byte = Some(c / bytes as f64);
        }
    }
    if let Some(r) = &bed.relay {
        let after = [r.a_to_b.snapshot(), r.b_to_a.snapshot()];
        rec.relay = after
            .iter()
            .zip(&relay_before)
            .map(|(a, b)| a.since(b))
            .collect();
    }
    drop(tun);
    drop(bed);
    Ok(())
}
