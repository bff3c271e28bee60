//! `lab report`: a self-contained HTML page with SVG charts (throughput with min–max
//! bars, latency percentiles, stacked per-core CPU), a history table across result
//! sets with the % change per cell, and the Markdown summary.

use crate::record::RunRecord;
use crate::stats::pct_change;
use crate::summary::{self, group, metrics_for, summary_of, Metric};
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub(crate) const COLORS: [&str; 6] = [
    "#3b6fb6", "#d9822b", "#4f9d69", "#a04ca0", "#888888", "#c44e52",
];

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Opens an SVG of `w`×`h` with an accessible title and a bold heading line.
pub(crate) fn svg_open(w: f64, h: f64, title: &str, heading: &str, heading_y: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img"><title>{}</title><text x="4" y="{heading_y}" font-size="13" font-weight="bold">{}</text>"#,
        esc(title),
        esc(heading)
    )
}

/// Horizontal bars (median) with min–max whiskers, one per implementation.
fn bar_chart(title: &str, unit: &str, rows: &[(String, usize, f64, f64, f64)]) -> String {
    let (w, row_h, left) = (640.0, 26.0, 130.0);
    let h = 40.0 + row_h * rows.len() as f64;
    let max = rows.iter().map(|r| r.4).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let x = |v: f64| left + (w - left - 20.0) * v / max;
    let mut s = svg_open(w, h, title, &format!("{title} ({unit})"), 16.0);
    for (i, (name, color, med, lo, hi)) in rows.iter().enumerate() {
        let y = 28.0 + row_h * i as f64;
        let c = COLORS[color % COLORS.len()];
        let _ = write!(
            s,
            r#"<text x="4" y="{ty}" font-size="12">{n}</text><rect x="{left}" y="{y}" width="{bw:.1}" height="16" fill="{c}"/><line x1="{l:.1}" x2="{r:.1}" y1="{my}" y2="{my}" stroke="black"/><line x1="{l:.1}" x2="{l:.1}" y1="{y1}" y2="{y2}" stroke="black"/><line x1="{r:.1}" x2="{r:.1}" y1="{y1}" y2="{y2}" stroke="black"/><text x="{tx:.1}" y="{ty}" font-size="11">{v}</text>"#,
            ty = y + 12.0,
            n = esc(name),
            bw = (x(*med) - left).max(0.5),
            l = x(*lo),
            r = x(*hi),
            my = y + 8.0,
            y1 = y + 3.0,
            y2 = y + 13.0,
            tx = x(*hi) + 4.0,
            v = format_args!("{med:.3}"),
        );
    }
    s.push_str("</svg>");
    s
}

/// Grouped bars of latency percentiles per implementation.
fn latency_chart(title: &str, rows: &[(String, usize, [f64; 4])]) -> String {
    let (w, h, left, bottom) = (640.0, 220.0, 50.0, 180.0);
    let max = rows
        .iter()
        .flat_map(|r| r.2)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let group_w = (w - left - 10.0) / 4.0;
    let bar_w = (group_w - 10.0) / rows.len().max(1) as f64;
    let mut s = svg_open(w, h, title, &format!("{title} (µs)"), 14.0);
    for (p, label) in ["p50", "p90", "p99", "p99.9"].iter().enumerate() {
        let gx = left + group_w * p as f64;
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" font-size="12">{label}</text>"#,
            gx + group_w / 2.0 - 12.0,
            bottom + 16.0
        );
        for (i, (_, color, v)) in rows.iter().enumerate() {
            let bh = (bottom - 24.0) * v[p] / max;
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{:.1} µs</title></rect>"#,
                gx + 5.0 + bar_w * i as f64,
                bottom - bh,
                bar_w - 2.0,
                bh,
                COLORS[color % COLORS.len()],
                v[p]
            );
        }
    }
    let _ = write!(
        s,
        r#"<line x1="{left}" x2="{w}" y1="{bottom}" y2="{bottom}" stroke="black"/>"#
    );
    for (i, (name, color, _)) in rows.iter().enumerate() {
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="200" width="10" height="10" fill="{}"/><text x="{:.1}" y="209" font-size="11">{}</text>"#,
            left + 120.0 * i as f64,
            COLORS[color % COLORS.len()],
            left + 14.0 + 120.0 * i as f64,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// Stacked per-core CPU split for one run of each implementation.
fn cpu_chart(title: &str, rows: &[(String, Vec<crate::cpu::CoreSplit>)]) -> String {
    let parts = [
        ("user", "#3b6fb6"),
        ("sys", "#d9822b"),
        ("softirq", "#c44e52"),
        ("irq", "#a04ca0"),
        ("idle", "#dddddd"),
    ];
    let (w, row_h, left) = (640.0, 18.0, 170.0);
    let lines: usize = rows.iter().map(|r| r.1.len()).sum();
    let h = 50.0 + row_h * lines as f64;
    let mut s = svg_open(w, h, title, title, 14.0);
    let mut y = 24.0;
    for (name, cores) in rows {
        for (ci, c) in cores.iter().enumerate() {
            let _ = write!(
                s,
                r#"<text x="4" y="{:.1}" font-size="11">{} cpu{ci}</text>"#,
                y + 11.0,
                esc(name)
            );
            let mut x = left;
            for (k, (label, color)) in parts.iter().enumerate() {
                let v = [c.user, c.sys, c.softirq, c.irq, c.idle][k];
                let bw = (w - left - 10.0) * v;
                let _ = write!(
                    s,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{bw:.1}" height="14" fill="{color}"><title>{label} {:.0}%</title></rect>"#,
                    v * 100.0
                );
                x += bw;
            }
            y += row_h;
        }
    }
    for (k, (label, color)) in parts.iter().enumerate() {
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{label}</text>"#,
            left + 80.0 * k as f64,
            y + 6.0,
            left + 14.0 + 80.0 * k as f64,
            y + 15.0
        );
    }
    s.push_str("</svg>");
    s
}

/// Orders implementations: as first seen in the records.
pub fn impl_order(records: &[RunRecord]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in records {
        if !v.contains(&r.implementation) {
            v.push(r.implementation.clone());
        }
    }
    v
}

/// History: for each cell, implementation and headline metric, the median per result
/// set (oldest first) and the % change from the previous set.
pub fn history_table(sets: &BTreeMap<String, Vec<RunRecord>>) -> String {
    let names: Vec<&String> = sets.keys().collect();
    let mut rows: BTreeMap<(String, String, &'static str), Vec<Option<f64>>> = BTreeMap::new();
    let mut units: BTreeMap<&'static str, (&'static str, f64, bool)> = BTreeMap::new();
    for (i, recs) in sets.values().enumerate() {
        let g = group(recs);
        for (cell, impls) in &g.by_cell {
            for (name, runs) in impls {
                for m in metrics_for(runs[0]) {
                    units.insert(m.name, (m.unit, m.scale, m.higher_is_better));
                    let row = rows
                        .entry((cell.clone(), name.clone(), m.name))
                        .or_insert_with(|| vec![None; names.len()]);
                    row[i] = summary_of(runs, m.extract).map(|s| s.median * m.scale);
                }
            }
        }
    }
    // A change is judged only between sets of one CPU model: across machines it says
    // nothing about the code.
    let cpus: Vec<&str> = sets
        .values()
        .map(|recs| recs.first().map_or("", |r| r.env.cpu_model.as_str()))
        .collect();
    let mut out = String::from("<table><tr><th>cell</th><th>implementation</th><th>figure</th>");
    for (n, cpu) in names.iter().zip(&cpus) {
        let _ = write!(out, "<th>{}<br><small>{}</small></th>", esc(n), esc(cpu));
    }
    out.push_str("</tr>");
    for ((cell, name, metric), vals) in &rows {
        let (unit, _, higher) = units[metric];
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{metric} {unit}</td>",
            esc(cell),
            esc(name)
        );
        let mut prev: Option<(f64, &str)> = None;
        for (v, cpu) in vals.iter().zip(&cpus) {
            match v {
                Some(v) => {
                    let change = prev
                        .filter(|(_, c)| c == cpu)
                        .and_then(|(p, _)| pct_change(p, *v));
                    let cls = match change {
                        Some(c) if c.abs() >= 5.0 && ((c > 0.0) == higher) => "better",
                        Some(c) if c.abs() >= 5.0 => "worse",
                        _ => "",
                    };
                    let ch =
                        change.map_or(String::new(), |c| format!(" <small>({c:+.1}%)</small>"));
                    let _ = write!(out, r#"<td class="{cls}">{v:.3}{ch}</td>"#);
                    prev = Some((*v, cpu));
                }
                None => out.push_str("<td>–</td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// Builds the whole page for the newest set, with history over all sets.
pub fn html(sets: &BTreeMap<String, Vec<RunRecord>>, baseline: &str) -> String {
    let (set, records) = sets.iter().next_back().expect("at least one result set");
    let order = impl_order(records);
    let g = group(records);
    let mut body = String::new();
    let md = summary::markdown(records, baseline, &order);
    for cell in &g.cells {
        let impls = &g.by_cell[cell];
        let first = g.first_of(cell);
        let _ = write!(body, "<h2>{}</h2><div class=\"charts\">", esc(cell));
        if matches!(first.cell, crate::matrix::Cell::Rr { .. }) {
            let rows: Vec<(String, usize, [f64; 4])> = order
                .iter()
                .enumerate()
                .filter_map(|(ci, n)| {
                    let runs = impls.get(n)?;
                    let q =
                        |f: fn(&RunRecord) -> Option<f64>| summary_of(runs, f).map(|s| s.median);
                    Some((
                        n.clone(),
                        ci,
                        [
                            q(|r| r.latency.map(|l| l.p50_us))?,
                            q(|r| r.latency.map(|l| l.p90_us))?,
                            q(|r| r.latency.map(|l| l.p99_us))?,
                            q(|r| r.latency.map(|l| l.p999_us))?,
                        ],
                    ))
                })
                .collect();
            body.push_str(&latency_chart(
                &format!("{cell}: latency percentiles"),
                &rows,
            ));
        } else {
            let m: Metric = metrics_for(first)[0];
            let rows: Vec<_> = order
                .iter()
                .enumerate()
                .filter_map(|(ci, n)| {
                    let s = summary_of(impls.get(n)?, m.extract)?;
                    Some((
                        n.clone(),
                        ci,
                        s.median * m.scale,
                        s.min * m.scale,
                        s.max * m.scale,
                    ))
                })
                .collect();
            body.push_str(&bar_chart(&format!("{cell}: {}", m.name), m.unit, &rows));
        }
        let cpu_rows: Vec<_> = order
            .iter()
            .filter_map(|n| {
                let r = impls.get(n)?.iter().find(|r| r.error.is_none())?;
                Some((n.clone(), r.cpu.cores.clone()))
            })
            .collect();
        body.push_str(&cpu_chart(
            &format!("{cell}: per-core CPU (first repeat)"),
            &cpu_rows,
        ));
        body.push_str("</div>");
    }
    let env = records.first().map(|r| &r.env);
    format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>wirelane lab: {title}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}.better{{background:#dff3e0}}.worse{{background:#f8dcdc}}
.charts{{display:flex;flex-wrap:wrap;gap:12px}}pre{{background:#f5f5f5;padding:1em;overflow:auto;font-size:12px}}</style></head><body>
<h1>wirelane lab: {title}</h1><p>Result set <code>{set}</code>; {cores} cores, {cpu}; kernel {kernel}; commit {commit}.
Bars are medians over repeats with min–max whiskers; ratios are against <b>{baseline}</b>.</p>
{body}{star}{signatures}<h2>History</h2>{history}<h2>Markdown summary</h2><pre>{md}</pre></body></html>"#,
        title = esc(&records.first().map_or(String::new(), |r| r.matrix.clone())),
        set = esc(set),
        cores = env.map_or(0, |e| e.cores),
        cpu = esc(env.map_or("", |e| e.cpu_model.as_str())),
        kernel = esc(env.map_or("", |e| e.kernel.as_str())),
        commit = esc(env.map_or("", |e| e.commit.as_str())),
        baseline = esc(baseline),
        history = history_table(sets),
        signatures = signatures_html(&g, &order),
        star = crate::star::report::charts_html(
            &records
                .iter()
                .filter_map(|r| r.star.clone())
                .collect::<Vec<_>>()
        ),
        md = esc(&md),
    )
}

/// The execution-order signatures of wirelane's models, side by side with the core
/// spread (see `summary::signature_rows`).
fn signatures_html(g: &summary::Grouped<'_>, order: &[String]) -> String {
    let rows = summary::signature_rows(g, order);
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h2>Execution-order signatures (receiving end)</h2><table><tr>");
    for h in summary::SIGNATURE_HEADER {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>");
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{}</td>", esc(&c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// Reads every `results.jsonl` under the given directories, grouped by result set.
pub fn load_sets(dirs: &[std::path::PathBuf]) -> crate::Result<BTreeMap<String, Vec<RunRecord>>> {
    let mut sets: BTreeMap<String, Vec<RunRecord>> = BTreeMap::new();
    for d in dirs {
        let path = d.join("results.jsonl");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let r: RunRecord = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            sets.entry(r.set.clone()).or_default().push(r);
        }
    }
    if sets.is_empty() {
        return Err("no results found".into());
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{Cell, Direction};
    use crate::workload::tcp::TcpResult;

    fn rec(set: &str, imp: &str, repeat: usize, gbps: f64) -> RunRecord {
        let cell = Cell::Tcp {
            streams: 1,
            direction: Direction::AToB,
            tunnels: 1,
            impairment: Default::default(),
        };
        RunRecord {
            schema: crate::record::SCHEMA,
            set: set.into(),
            timestamp: String::new(),
            env: Default::default(),
            matrix: "m".into(),
            baseline: "wireguard-go".into(),
            cell_id: cell.id(),
            cell,
            implementation: imp.into(),
            version: String::new(),
            repeat,
            seconds: 1.0,
            error: None,
            tcp: vec![TcpResult {
                bytes: (gbps * 1.25e8) as u64,
                seconds: 1.0,
                goodput_bps: gbps * 1e9,
                ..Default::default()
            }],
            udp: None,
            latency: None,
            cpu: Default::default(),
            peak_rss_kib: vec![],
            cycles_per_byte: None,
            relay: vec![],
            signatures: vec![],
            daemon_threads: 0,
            star: None,
        }
    }

    /// The paired ratio divides each run by the baseline's run of its own repeat: here
    /// the baseline ran slow in two repeats of three, so its median halves, while the
    /// other implementation is 10% ahead within every repeat. A repeat whose baseline
    /// run failed pairs with nothing.
    #[test]
    fn paired_ratios_divide_runs_of_the_same_repeat() {
        let base = [
            rec("s", "base", 0, 4.0),
            rec("s", "base", 1, 2.0),
            rec("s", "base", 2, 2.0),
            RunRecord {
                error: Some("failed".into()),
                ..rec("s", "base", 3, 1.0)
            },
        ];
        let other = [
            rec("s", "new", 0, 4.4),
            rec("s", "new", 1, 2.2),
            rec("s", "new", 2, 2.2),
            rec("s", "new", 3, 40.0),
        ];
        let (b, o): (Vec<&RunRecord>, Vec<&RunRecord>) =
            (base.iter().collect(), other.iter().collect());
        let goodput = |r: &RunRecord| r.tcp.first().map(|t| t.goodput_bps);
        let paired = crate::summary::paired_ratio(&o, &b, goodput).unwrap();
        assert!((paired - 1.1).abs() < 1e-9, "{paired}");
        let md = crate::summary::markdown(
            &base.iter().chain(other.iter()).cloned().collect::<Vec<_>>(),
            "base",
            &["base".to_string(), "new".to_string()],
        );
        assert!(md.contains("(paired 1.10×)"), "{md}");
    }

    #[test]
    fn history_shows_change_between_sets() {
        let mut sets = BTreeMap::new();
        sets.insert(
            "2026-01-01 a".to_string(),
            vec![
                rec("2026-01-01 a", "wirelane", 0, 1.0),
                rec("2026-01-01 a", "wirelane", 1, 3.0),
            ],
        );
        sets.insert(
            "2026-01-02 b".to_string(),
            vec![
                rec("2026-01-02 b", "wirelane", 0, 2.2),
                rec("2026-01-02 b", "wireguard-go", 0, 1.1),
            ],
        );
        let h = history_table(&sets);
        // Median of 1.0 and 3.0 is 2.0; then 2.2 is +10%.
        assert!(h.contains("2.000"), "{h}");
        assert!(
            h.contains("(+10.0%)") && h.contains(r#"class="better""#),
            "{h}"
        );
        let page = html(&sets, "wireguard-go");
        assert!(
            page.contains("<svg") && page.contains("2.00×"),
            "ratio against the baseline"
        );
        assert!(page.starts_with("<!doctype html>") && !page.contains("<script"));
    }

    #[test]
    fn markdown_reports_median_min_max_and_ratio() {
        let recs = vec![
            rec("s", "wirelane", 0, 1.0),
            rec("s", "wirelane", 1, 3.0),
            rec("s", "wirelane", 2, 2.0),
            rec("s", "wireguard-go", 0, 1.0),
        ];
        let md = crate::summary::markdown(
            &recs,
            "wireguard-go",
            &["wirelane".into(), "wireguard-go".into()],
        );
        assert!(
            // Only repeat 0 has a baseline run to pair with: 1.0 against 1.0.
            md.contains(
                "| tcp 1x a→b | wirelane | goodput Gbit/s | 2.00 (1.00–3.00) | 2.00× (paired 1.00×) |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| tcp 1x a→b | wireguard-go | goodput Gbit/s | 1.00 (1.00–1.00) | 1.00× |"
            ),
            "{md}"
        );
    }
}
