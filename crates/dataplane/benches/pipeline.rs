//! Pipeline microbenchmark on the real runtime: a client and a gateway tunnel in one
//! process (`memory::rig`), with in-memory TUN and UDP ports, so every stage, the
//! execution model's threads, the readers and the handshake are the daemon's own, and
//! no system call is on the data path. The client's TUN is fed 1420-byte IPv4 packets
//! in vectors of 64, keeping a bounded number in flight (a closed loop); the gateway's
//! TUN sink checks every one (in order, once, intact) and counts it.
//!
//! Compared, in interleaved repeats, with the raw AEAD of the same library on the same
//! work (seal then open each packet of a vector on one thread, no queues), and with
//! that raw AEAD on two threads, the machine's own two-core ceiling. The pipeline
//! costs more than the AEAD by what the daemon does besides: the TUN reader's copy,
//! routing, numbering, batching, the outer datagram's copy through the memory socket,
//! classification and the ordered stages, on the same two cores as the crypto.
//!
//!   cargo bench -p wirelane-dataplane --bench pipeline [-- MODEL...]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::memory::rig::Rig;
use wirelane_dataplane::packet::{HEADROOM, MAX_BATCH};
use wirelane_proto::handshake::SessionKeys;
use wirelane_proto::Keypair;

/// Full-size packets, as bulk TCP produces at the default MTU.
const PAYLOAD: usize = 1420;
/// Packets in flight: enough to keep two workers busy.
const IN_FLIGHT: u64 = 16 * MAX_BATCH as u64;
const REPEATS: usize = 5;
const PER_REPEAT: Duration = Duration::from_millis(2000);

/// Plaintext bytes per second through the runtime with `workers` workers.
fn pipeline(model: Model, workers: usize) -> f64 {
    let rig = Rig::new(model, workers, 1, None).expect("rig");
    let client = &rig.clients[0];
    let gw = rig.gateway.inner;
    let seen = &rig.gateway.seen;
    // The handshake, and a first vector through.
    client.send(gw, 1, PAYLOAD);
    while seen.packets.load(Ordering::Relaxed) < 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut sent, start_packets) = (1u64, 1u64);
    let start = Instant::now();
    while start.elapsed() < PER_REPEAT {
        let delivered = seen.packets.load(Ordering::Relaxed);
        if sent - delivered + MAX_BATCH as u64 <= IN_FLIGHT {
            client.send(gw, MAX_BATCH, PAYLOAD);
            sent += MAX_BATCH as u64;
        } else {
            // Not a spin: the injector must not take a core from the pipeline.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let elapsed = start.elapsed();
    let delivered = seen.packets.load(Ordering::Relaxed) - start_packets;
    assert_eq!(
        seen.wrong.load(Ordering::Relaxed),
        0,
        "misdelivered packets"
    );
    (delivered as usize * PAYLOAD) as f64 / elapsed.as_secs_f64()
}

fn keypairs() -> (Keypair, Keypair) {
    let (k1, k2) = ([1u8; 32], [2u8; 32]);
    let sender = SessionKeys {
        send: k1,
        recv: k2,
        local_index: 1,
        remote_index: 2,
        is_initiator: true,
    };
    let receiver = SessionKeys {
        send: k2,
        recv: k1,
        local_index: 2,
        remote_index: 1,
        is_initiator: false,
    };
    (
        Keypair::new(&sender, Duration::ZERO),
        Keypair::new(&receiver, Duration::ZERO),
    )
}

/// Plaintext bytes per second of seal-then-open on `threads` threads, no queues.
fn raw_aead(threads: usize) -> f64 {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let (send_kp, recv_kp) = keypairs();
                let mut bufs: Vec<Vec<u8>> = (0..MAX_BATCH)
                    .map(|_| vec![0xa5; HEADROOM + PAYLOAD + 16])
                    .collect();
                barrier.wait();
                let start = Instant::now();
                let mut counter = 0u64;
                while start.elapsed() < PER_REPEAT {
                    let first = counter;
                    // Keys prepared once per batch, as the crypt stages do.
                    let (sealer, opener) = (send_kp.sealer(), recv_kp.opener());
                    for b in bufs.iter_mut() {
                        sealer.seal(counter, b);
                        counter += 1;
                    }
                    for (i, b) in bufs.iter_mut().enumerate() {
                        opener.open(first + i as u64, b).expect("opens");
                    }
                }
                (counter as usize * PAYLOAD) as f64 / start.elapsed().as_secs_f64()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn gb(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{:.3}", x / 1e9))
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    // `cargo bench` passes `--bench`; anything else names models.
    let models: Vec<Model> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let models = if models.is_empty() {
        vec![Model::Workqueue]
    } else {
        models
    };
    let mut raw1 = Vec::new();
    let mut raw2 = Vec::new();
    let mut runs: Vec<(Model, usize, Vec<f64>)> = models
        .iter()
        .flat_map(|m| [(*m, 1, Vec::new()), (*m, 2, Vec::new())])
        .collect();
    for _ in 0..REPEATS {
        raw1.push(raw_aead(1));
        raw2.push(raw_aead(2));
        for (m, w, v) in runs.iter_mut() {
            v.push(pipeline(*m, *w));
        }
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "{cpu}: {PAYLOAD}-byte packets in vectors of {MAX_BATCH}, plaintext GB/s, median of \
         {REPEATS} interleaved repeats of {PER_REPEAT:?}:"
    );
    let (r1, r2) = (median(raw1.clone()), median(raw2.clone()));
    println!(
        "  raw AEAD (seal + open), 1 thread   {:.3}  ({})",
        r1 / 1e9,
        gb(&raw1)
    );
    println!(
        "  raw AEAD (seal + open), 2 threads  {:.3}  ({})",
        r2 / 1e9,
        gb(&raw2)
    );
    for (m, w, v) in &runs {
        let p = median(v.clone());
        let raw = if *w == 1 { r1 } else { r2 };
        println!(
            "  runtime, {m}, {w} worker(s)       {:.3}  ({})  = {:.2} of raw AEAD on {w} thread(s)",
            p / 1e9,
            gb(v),
            p / raw
        );
    }
}
