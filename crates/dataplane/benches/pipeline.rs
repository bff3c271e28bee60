//! Pipeline microbenchmark: packet vectors go encrypt → per-peer ordered flush →
//! decrypt → per-peer ordered delivery, through the real stage functions
//! (`seal_batch`, `open_batch`), batches, pooled packets and ordered queues, on N worker
//! threads that share one FIFO as in the workqueue model. No system calls: the flush
//! hands sealed datagrams straight to the receiving side, and delivery re-sends each
//! vector, so a fixed number of batches circulates (a closed loop).
//!
//! Compared, in interleaved repeats, with the raw AEAD of the same library on the same
//! work (seal then open each 1420-byte packet of a vector on one thread, no queues),
//! and with that raw AEAD on two threads, the machine's own two-core ceiling.
//!
//! Delivery checks every packet: authenticated, accepted by the replay window, in
//! counter order, contents intact. A violation aborts the benchmark.
//!
//!   cargo bench -p wirelane-dataplane --bench pipeline

use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use wirelane_dataplane::packet::{Batch, Packet, HEADROOM, MAX_BATCH};
use wirelane_dataplane::peer::Peer;
use wirelane_dataplane::stages::{decrypt::open_batch, encrypt::seal_batch};
use wirelane_proto::handshake::SessionKeys;
use wirelane_proto::Keypair;

const MTU: usize = 1420;
/// Full-size plaintext packets, as bulk TCP produces at this MTU.
const PAYLOAD: usize = MTU;
/// Batches circulating: enough to keep two workers busy while flush and delivery run.
const IN_FLIGHT: usize = 8;
const REPEATS: usize = 5;
const PER_REPEAT: Duration = Duration::from_millis(2000);

enum Job {
    Encrypt(Arc<Batch>),
    Decrypt(Arc<Batch>),
    Flush,
    Deliver,
}

/// One direction of a tunnel: the sender's peer entry and keypair, the receiver's.
struct Link {
    tx_peer: Arc<Peer>,
    rx_peer: Arc<Peer>,
    send_kp: Arc<Keypair>,
    recv_kp: Arc<Keypair>,
    jobs: Sender<Job>,
    /// Next counter delivery expects (delivery is serial, so this is its own state).
    next_counter: Mutex<u64>,
    delivered_bytes: AtomicU64,
    stopping: AtomicBool,
    in_flight: AtomicUsize,
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

/// A vector of plaintext packets; each carries its slot number in its first 8 bytes.
fn vector(first_slot: usize) -> Vec<Packet> {
    (0..MAX_BATCH)
        .map(|i| {
            let mut body = vec![0xa5u8; PAYLOAD];
            body[..8].copy_from_slice(&((first_slot + i) as u64).to_le_bytes());
            Packet::from_plaintext(&[&body])
        })
        .collect()
}

impl Link {
    /// Stage TX-3's job: consecutive counters, then the ordered queue and the FIFO in
    /// that order. Called only from delivery (serial) or before the workers start.
    fn send(&self, mut packets: Vec<Packet>) {
        let first = self
            .send_kp
            .reserve_counters(packets.len() as u64, Duration::ZERO)
            .expect("counters");
        for (i, p) in packets.iter_mut().enumerate() {
            p.counter = first + i as u64;
            p.ok = false;
        }
        let n = packets.len();
        let batch = Batch::new(self.tx_peer.clone(), self.send_kp.clone(), packets);
        assert!(
            self.tx_peer.tx_queue.push(batch.clone(), n),
            "TX queue full"
        );
        self.jobs.send(Job::Encrypt(batch)).unwrap();
    }

    /// Stage TX-5 without the socket: sealed datagrams go to the receiver as received
    /// transport messages.
    fn flush(&self) {
        self.tx_peer.tx_queue.drain(|b| {
            let mut packets = std::mem::take(&mut b.body().packets);
            for p in packets.iter_mut() {
                assert!(p.ok, "sealed");
                p.ok = false;
            }
            let n = packets.len();
            let rx = Batch::new(self.rx_peer.clone(), self.recv_kp.clone(), packets);
            assert!(self.rx_peer.rx_queue.push(rx.clone(), n), "RX queue full");
            self.jobs.send(Job::Decrypt(rx)).unwrap();
        });
    }

    /// Stage RX-4 without the TUN: checks, counts, and sends the vector around again.
    fn deliver(&self) {
        self.rx_peer.rx_queue.drain(|b| {
            let packets = std::mem::take(&mut b.body().packets);
            let mut next = self.next_counter.lock().unwrap();
            let mut bytes = 0;
            let slot = |p: &Packet| u64::from_le_bytes(p.plaintext()[..8].try_into().unwrap());
            let first_slot = slot(&packets[0]);
            for (i, p) in packets.iter().enumerate() {
                assert!(p.ok, "packet {} failed authentication", p.counter);
                assert!(self.recv_kp.accept_counter(p.counter), "replay window");
                assert_eq!(p.counter, *next, "out of order");
                *next += 1;
                let plain = p.plaintext();
                assert_eq!(plain.len(), PAYLOAD);
                assert_eq!(slot(p), first_slot + i as u64, "contents");
                assert_eq!(plain[PAYLOAD - 1], 0xa5, "contents");
                bytes += plain.len() as u64;
            }
            drop(next);
            self.delivered_bytes.fetch_add(bytes, Ordering::Relaxed);
            if self.stopping.load(Ordering::Relaxed) {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            // Opened in place, each packet is a plaintext packet again: send it round.
            self.send(packets);
        });
    }
}

fn worker(link: &Link, jobs: &Receiver<Job>) {
    loop {
        match jobs.recv_timeout(Duration::from_millis(5)) {
            Ok(Job::Encrypt(b)) => {
                seal_batch(&b, MTU);
                if link.tx_peer.tx_queue.schedule() {
                    link.jobs.send(Job::Flush).unwrap();
                }
            }
            Ok(Job::Decrypt(b)) => {
                open_batch(&b);
                if link.rx_peer.rx_queue.schedule() {
                    link.jobs.send(Job::Deliver).unwrap();
                }
            }
            Ok(Job::Flush) => link.flush(),
            Ok(Job::Deliver) => link.deliver(),
            Err(_) if link.in_flight.load(Ordering::SeqCst) == 0 => return,
            Err(_) => {}
        }
    }
}

/// Plaintext bytes per second through the pipeline on `workers` threads.
fn pipeline(workers: usize) -> f64 {
    let (send_kp, recv_kp) = keypairs();
    let (tx, rx) = crossbeam_channel::unbounded();
    let link = Arc::new(Link {
        tx_peer: Arc::new(Peer::new(1, [1; 32], [0; 32])),
        rx_peer: Arc::new(Peer::new(2, [2; 32], [0; 32])),
        send_kp: Arc::new(send_kp),
        recv_kp: Arc::new(recv_kp),
        jobs: tx,
        next_counter: Mutex::new(0),
        delivered_bytes: AtomicU64::new(0),
        stopping: AtomicBool::new(false),
        in_flight: AtomicUsize::new(IN_FLIGHT),
    });
    for i in 0..IN_FLIGHT {
        link.send(vector(i * MAX_BATCH));
    }
    let start = Instant::now();
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (link, rx) = (link.clone(), rx.clone());
            std::thread::spawn(move || worker(&link, &rx))
        })
        .collect();
    std::thread::sleep(PER_REPEAT);
    let bytes = link.delivered_bytes.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    link.stopping.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker");
    }
    bytes as f64 / elapsed.as_secs_f64()
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
                    for b in bufs.iter_mut() {
                        send_kp.seal(counter, b);
                        counter += 1;
                    }
                    for (i, b) in bufs.iter_mut().enumerate() {
                        recv_kp.open(first + i as u64, b).expect("opens");
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

fn main() {
    let mut raw1 = Vec::new();
    let mut raw2 = Vec::new();
    let mut one = Vec::new();
    let mut two = Vec::new();
    for _ in 0..REPEATS {
        raw1.push(raw_aead(1));
        one.push(pipeline(1));
        raw2.push(raw_aead(2));
        two.push(pipeline(2));
    }
    let gb = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.3}", x / 1e9))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (r1, p1, r2, p2) = (
        median(raw1.clone()),
        median(one.clone()),
        median(raw2.clone()),
        median(two.clone()),
    );
    println!(
        "Seal + open of {PAYLOAD}-byte packets in vectors of {MAX_BATCH}, plaintext GB/s, \
         median of {REPEATS} interleaved repeats of {PER_REPEAT:?}:"
    );
    println!("  raw AEAD, 1 thread     {:.3}  ({})", r1 / 1e9, gb(&raw1));
    println!("  pipeline, 1 worker     {:.3}  ({})", p1 / 1e9, gb(&one));
    println!("  raw AEAD, 2 threads    {:.3}  ({})", r2 / 1e9, gb(&raw2));
    println!("  pipeline, 2 workers    {:.3}  ({})", p2 / 1e9, gb(&two));
    println!(
        "  pipeline 1 worker / raw AEAD 1 thread    = {:.2}",
        p1 / r1
    );
    println!(
        "  pipeline 2 workers / pipeline 1 worker   = {:.2}",
        p2 / p1
    );
    println!(
        "  raw AEAD 2 threads / raw AEAD 1 thread   = {:.2}",
        r2 / r1
    );
}
