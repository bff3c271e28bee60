//! Which ChaCha20-Poly1305 to use for transport data: ring (the choice) against the
//! pure-Rust RustCrypto crate, sealing 1420-byte packets in place on one core.
//! Interleaved repeats (A B A B …); medians and the ratio are printed.
//!
//!   cargo bench -p wirelane-proto --bench aead

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use std::time::{Duration, Instant};
use wirelane_proto::crypto::AeadKey;

const PACKET: usize = 1420;
const REPEATS: usize = 5;
const PER_REPEAT: Duration = Duration::from_millis(1500);

/// Seals packets for `PER_REPEAT` and returns bytes per second.
fn run(mut seal: impl FnMut(u64, &mut [u8])) -> f64 {
    let mut buf = vec![0x42u8; PACKET + 16];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < PER_REPEAT {
        for _ in 0..256 {
            seal(n, &mut buf);
            n += 1;
        }
    }
    std::hint::black_box(&buf);
    (n as usize * PACKET) as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let key = [7u8; 32];
    let ring_key = AeadKey::new(&key);
    let rc = ChaCha20Poly1305::new(&key.into());
    let (mut ring, mut rustcrypto) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        ring.push(run(|c, buf| ring_key.seal_in_place(c, &[], buf)));
        rustcrypto.push(run(|c, buf| {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&c.to_le_bytes());
            let (data, tag_out) = buf.split_at_mut(PACKET);
            let tag = rc
                .encrypt_in_place_detached(&nonce.into(), &[], data)
                .unwrap();
            tag_out.copy_from_slice(&tag);
        }));
    }
    let gb = |x: f64| x / 1e9;
    let (r, c) = (median(ring.clone()), median(rustcrypto.clone()));
    println!("ChaCha20-Poly1305 seal, {PACKET}-byte packets, one core, median of {REPEATS} interleaved repeats:");
    println!(
        "  ring        {:.3} GB/s  (runs: {:?})",
        gb(r),
        ring.iter()
            .map(|x| format!("{:.3}", gb(*x)))
            .collect::<Vec<_>>()
    );
    println!(
        "  rustcrypto  {:.3} GB/s  (runs: {:?})",
        gb(c),
        rustcrypto
            .iter()
            .map(|x| format!("{:.3}", gb(*x)))
            .collect::<Vec<_>>()
    );
    println!("  ring / rustcrypto = {:.2}x", r / c);
}
