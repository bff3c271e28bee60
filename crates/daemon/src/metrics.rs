//! What `/metrics` exposes: every tunnel's counters as Prometheus metric families,
//! built afresh on each scrape from snapshots and encoded by the `prometheus` crate in
//! the text format (version 0.0.4, which `promtool check metrics` and every Prometheus
//! read; prometheus-client writes only OpenMetrics, whose counters Debian 12's
//! promtool 2.42 rejects).
//!
//! Flow: the scrape takes each interface's [`DeviceSnapshot`] (the `wg show` copy,
//! under the peer table's read lock for the copy only) and reads the atomic counters;
//! it formats after every lock is released, so the data path never waits on a scrape.
//!
//! Names: per-device and per-peer series are those of mdlayher's `wireguard_exporter`,
//! so its dashboards work unchanged, with `public_key` as the only per-peer label;
//! wirelane's own series are prefixed `wirelane_` and cover what `stats=1` reports.

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use std::net::IpAddr;
use std::sync::Arc;
use wirelane_dataplane::sockets::SocketRole;
use wirelane_dataplane::stats::{hist_lower_bound, DROP_REASONS};
use wirelane_dataplane::{Interface, Runtime};
use wirelane_proto::{base64_key, InitiationReason};

/// `stats=1` counters exposed as a series of their own: (counter, metric, help).
const COUNTERS: &[(&str, &str, &str)] = &[
    (
        "handshakes_completed",
        "wirelane_handshakes_completed_total",
        "Handshakes completed: initiations answered and responses consumed.",
    ),
    (
        "handshake_dh",
        "wirelane_handshake_dh_operations_total",
        "Diffie-Hellman operations spent on received handshake messages.",
    ),
    (
        "cookie_replies_sent",
        "wirelane_cookie_replies_sent_total",
        "Cookie replies sent while under load.",
    ),
    (
        "tx_icmp_unreachable",
        "wirelane_icmp_unreachable_sent_total",
        "ICMP destination-unreachable errors written back for packets no peer routes.",
    ),
    (
        "tx_icmp_rate_limited",
        "wirelane_icmp_rate_limited_total",
        "ICMP errors not sent for the rate limit.",
    ),
    (
        "rx_buffer_shrunk",
        "wirelane_receive_buffer_shrunk_total",
        "Times a data socket's receive buffer was shrunk for an overload standing in it.",
    ),
    (
        "rx_buffer_restored",
        "wirelane_receive_buffer_restored_total",
        "Times a shrunk data socket's receive buffer was given its full size back.",
    ),
    (
        "serial_empty_polls",
        "wirelane_serial_empty_polls_total",
        "Serial-stage invocations that found nothing ready (an execution-order signature).",
    ),
    (
        "serial_head_pending",
        "wirelane_serial_head_pending_total",
        "Serial-stage invocations that stopped at a head batch not yet decrypted or encrypted.",
    ),
    (
        "serial_budget_exhausted",
        "wirelane_serial_budget_exhausted_total",
        "Serial-stage invocations that used up their budget with more ready.",
    ),
    (
        "stage_panics",
        "wirelane_stage_panics_total",
        "Pipeline work that panicked (a bug): each lost what it handled, and the pipeline went on.",
    ),
];

/// One tunnel as a scrape sees it.
pub struct Device {
    pub name: String,
    pub iface: Arc<Interface>,
}

/// Builds the families for `devices` served by `rt`.
pub fn gather(devices: &[Device], rt: &Runtime) -> Vec<MetricFamily> {
    let mut f = Families::default();
    for d in devices {
        device(&mut f, d, rt);
    }
    runtime(&mut f, rt);
    f.done()
}

/// The text exposition of [`gather`].
pub fn render(devices: &[Device], rt: &Runtime) -> String {
    let families = gather(devices, rt);
    // About 130 bytes a sample (a peer series with its base64 key is about 120): one
    // allocation instead of a dozen doublings and copies of a multi-megabyte string.
    let samples: usize = families.iter().map(|f| f.get_metric().len()).sum();
    let mut out = String::with_capacity(160 * samples + 256 * families.len());
    // The encoder fails only on a family it finds malformed, which `Families` never
    // builds; say so in the exposition rather than serve half of it.
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        out.clear();
        out.push_str(&format!("# wirelane: cannot encode metrics: {e}\n"));
    }
    out
}

fn device(f: &mut Families, d: &Device, rt: &Runtime) {
    let dev = d.name.as_str();
    let iface = &d.iface;
    let snap = iface.snapshot();
    let own_key = iface
        .identity()
        .map(|i| base64_key(&i.public))
        .unwrap_or_default();
    f.gauge(
        "wireguard_device_info",
        "Metadata about a device.",
        &[("device", dev), ("public_key", &own_key)],
        1.0,
    );
    for p in &snap.peers {
        let key = base64_key(&p.public_key);
        let who = [("device", dev), ("public_key", key.as_str())];
        let endpoint = p.endpoint.map(|e| e.to_string()).unwrap_or_default();
        f.gauge(
            "wireguard_peer_info",
            "Metadata about a peer. The public_key label on peer metrics refers to the \
             peer's public key, not the device's.",
            &[who[0], who[1], ("endpoint", &endpoint)],
            1.0,
        );
        for a in &p.allowed_ips {
            let family = match a.addr {
                IpAddr::V4(_) => "IPv4",
                IpAddr::V6(_) => "IPv6",
            };
            f.gauge(
                "wireguard_peer_allowed_ips_info",
                "Metadata about each of a peer's allowed IP subnets for a given device.",
                &[
                    who[0],
                    who[1],
                    ("allowed_ips", &a.to_string()),
                    ("family", family),
                ],
                1.0,
            );
        }
        f.counter(
            "wireguard_peer_receive_bytes_total",
            "Number of bytes received from a given peer.",
            &who,
            p.rx_bytes as f64,
        );
        f.counter(
            "wireguard_peer_transmit_bytes_total",
            "Number of bytes transmitted to a given peer.",
            &who,
            p.tx_bytes as f64,
        );
        f.gauge(
            "wireguard_peer_last_handshake_seconds",
            "UNIX timestamp for the last handshake with a given peer (0: none).",
            &who,
            p.last_handshake.map_or(0.0, |t| t.as_secs() as f64),
        );
    }

    let stats = iface.stats.fields();
    let stat = |name: &str| {
        stats
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, v)| *v as f64)
    };
    let on = [("device", dev)];
    for reason in DROP_REASONS {
        f.counter(
            "wirelane_drops_total",
            "Packets and messages dropped, by reason (the stats=1 counter's name).",
            &[on[0], ("reason", reason)],
            stat(reason),
        );
    }
    for (counter, metric, help) in COUNTERS {
        f.counter(metric, help, &on, stat(counter));
    }
    for reason in InitiationReason::ALL {
        f.counter(
            "wirelane_handshake_initiations_total",
            "Handshake initiations sent, by the rule that started each.",
            &[on[0], ("reason", reason.name())],
            stat(&format!("initiations_{}", reason.name())),
        );
    }
    f.gauge(
        "wirelane_under_load",
        "1 while the handshake gate is under load (cookie replies instead of handshakes).",
        &on,
        f64::from(u8::from(iface.under_load())),
    );
    f.gauge(
        "wirelane_peers",
        "Peers configured.",
        &on,
        snap.peers.len() as f64,
    );
    for role in SocketRole::ALL {
        f.counter(
            "wirelane_socket_kernel_drops_total",
            "Datagrams the kernel dropped at the tunnel's UDP sockets (full receive buffers).",
            &[on[0], ("socket", role.name())],
            iface.kernel_drops(role) as f64,
        );
    }
    let queue_help = "Items waiting now: handshake messages, and the interface's work in the \
                      execution model's queue.";
    f.gauge(
        "wirelane_queue_depth",
        queue_help,
        &[on[0], ("queue", "handshake")],
        iface.handshake_queue_len() as f64,
    );
    f.gauge(
        "wirelane_queue_depth",
        queue_help,
        &[on[0], ("queue", "model")],
        rt.queued_for(iface) as f64,
    );
    f.counter(
        "wirelane_busy_seconds_total",
        "Seconds the runtime's threads spent on this interface's crypt and serial items.",
        &on,
        stat("busy_ns") / 1e9,
    );
    for (direction, marked) in [("tx", "tx_codel_marked"), ("rx", "rx_codel_marked")] {
        f.counter(
            "wirelane_codel_ce_marked_total",
            "ECN-capable packets CoDel marked CE instead of dropping them.",
            &[on[0], ("direction", direction)],
            stat(marked),
        );
    }
    f.counter(
        "wirelane_tx_ring_starved_total",
        "Times a peer's transmit ring ran empty while its adaptive byte limit held \
         packets back in the flow queues (each grew the limit).",
        &on,
        stat("tx_ring_starved"),
    );
    // Waits in two queues, as a sum and a count: rate(sum) / rate(count) is the mean.
    for (queue, dequeued, waited) in [
        ("flow", "tx_fq_dequeued", "tx_fq_sojourn_ns"),
        ("handshake", "handshake_dequeued", "handshake_sojourn_ns"),
    ] {
        let which = [on[0], ("queue", queue)];
        f.counter(
            "wirelane_queue_dequeued_total",
            "Items taken off a queue: packets off the flow queues, handshake messages off \
             the handshake lanes.",
            &which,
            stat(dequeued),
        );
        f.counter(
            "wirelane_queue_wait_seconds_total",
            "Seconds the items taken off a queue waited there, summed.",
            &which,
            stat(waited) / 1e9,
        );
    }
    let s = &iface.stats;
    // Bucket `i` holds invocations of fewer than `2^i` packets: its bound is `2^i - 1`.
    let serial = histogram(&s.histogram(|c| &c.serial_packets_hist), |i| {
        (hist_lower_bound(i + 1) - 1) as f64
    });
    f.histogram(
        "wirelane_serial_packets",
        "Packets handled per serial-stage invocation (an execution-order signature).",
        &on,
        serial,
        stat("serial_packets"),
    );
    // Bucket `i` holds sojourns under `2^i` µs.
    let upper_s = |i: usize| hist_lower_bound(i + 1) as f64 / 1e6;
    for (direction, hist, sum) in [
        ("rx", s.histogram(|c| &c.rx_sojourn_hist), "rx_sojourn_ns"),
        ("tx", s.histogram(|c| &c.tx_sojourn_hist), "tx_sojourn_ns"),
    ] {
        f.histogram(
            "wirelane_packet_sojourn_seconds",
            "Time from a packet's arrival to its leaving: rx from the kernel's receive \
             time to the TUN write, tx from the TUN read to the UDP send.",
            &[on[0], ("direction", direction)],
            histogram(&hist, upper_s),
            stat(sum) / 1e9,
        );
    }
}

/// The daemon's power-of-two buckets as cumulative Prometheus buckets, bucket `i`
/// bounded by `upper(i)`. The last bucket, unbounded, is the count: the encoder writes
/// it as `le="+Inf"`.
fn histogram(counts: &[u64], upper: impl Fn(usize) -> f64) -> (Vec<Bucket>, u64) {
    let mut cumulative = 0u64;
    let mut buckets = Vec::with_capacity(counts.len());
    for (i, b) in counts.iter().enumerate() {
        cumulative += b;
        if i + 1 == counts.len() {
            break;
        }
        let mut bucket = Bucket::default();
        bucket.set_upper_bound(upper(i));
        bucket.set_cumulative_count(cumulative);
        buckets.push(bucket);
    }
    (buckets, cumulative)
}

fn runtime(f: &mut Families, rt: &Runtime) {
    let version = env!("CARGO_PKG_VERSION");
    let model = rt.model().to_string();
    f.gauge(
        "wirelane_build_info",
        "The running build: its version and execution model.",
        &[("version", version), ("model", &model)],
        1.0,
    );
    f.gauge(
        "wirelane_workers",
        "Crypt workers in the runtime.",
        &[],
        rt.workers() as f64,
    );
    for t in rt.thread_stats() {
        let thread = [("thread", t.name.as_str())];
        f.counter(
            "wirelane_thread_busy_seconds_total",
            "Seconds each of the runtime's threads has run on a CPU.",
            &thread,
            t.busy_ns as f64 / 1e9,
        );
        for (kind, n) in [
            ("voluntary", t.voluntary_switches),
            ("involuntary", t.involuntary_switches),
        ] {
            f.counter(
                "wirelane_thread_context_switches_total",
                "Context switches of each runtime thread; involuntary ones are preemptions.",
                &[thread[0], ("kind", kind)],
                n as f64,
            );
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name(k.to_string());
            l.set_value(v.to_string());
            l
        })
        .collect()
}

/// Families in the order their first sample came, each sample appended to its family.
#[derive(Default)]
struct Families {
    order: Vec<MetricFamily>,
    index: std::collections::HashMap<&'static str, usize>,
}

impl Families {
    fn push(&mut self, name: &'static str, help: &str, kind: MetricType, m: Metric) {
        let i = *self.index.entry(name).or_insert_with(|| {
            let mut mf = MetricFamily::default();
            mf.set_name(name.to_string());
            mf.set_help(help.to_string());
            mf.set_field_type(kind);
            self.order.push(mf);
            self.order.len() - 1
        });
        self.order[i].mut_metric().push(m);
    }

    fn gauge(&mut self, name: &'static str, help: &str, l: &[(&str, &str)], v: f64) {
        let mut g = Gauge::default();
        g.set_value(v);
        let mut m = Metric::from_label(labels(l));
        m.set_gauge(g);
        self.push(name, help, MetricType::GAUGE, m);
    }

    fn counter(&mut self, name: &'static str, help: &str, l: &[(&str, &str)], v: f64) {
        let mut c = Counter::default();
        c.set_value(v);
        let mut m = Metric::from_label(labels(l));
        m.set_counter(c);
        self.push(name, help, MetricType::COUNTER, m);
    }

    /// A histogram of `buckets` (cumulative, see [`histogram`]) and their count, with
    /// `sum` the sum of the samples.
    fn histogram(
        &mut self,
        name: &'static str,
        help: &str,
        l: &[(&str, &str)],
        (buckets, count): (Vec<Bucket>, u64),
        sum: f64,
    ) {
        let mut h = Histogram::default();
        h.set_bucket(buckets);
        h.set_sample_count(count);
        h.set_sample_sum(sum);
        let mut m = Metric::from_label(labels(l));
        m.set_histogram(h);
        self.push(name, help, MetricType::HISTOGRAM, m);
    }

    fn done(self) -> Vec<MetricFamily> {
        self.order
    }
}
