//! Packet buffers and batches.
//!
//! A [`Packet`] reserves headroom for the 16-byte transport header and tailroom for the
//! padding and the 16-byte tag, so encryption and decryption happen in place without a
//! copy. A [`Batch`] is a vector of one peer's packets under one keypair: the unit the
//! pipeline moves between stages, and the unit of per-peer ordering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wirelane_proto::messages::TRANSPORT_HEADER_LEN;
use wirelane_proto::Keypair;

use crate::peer::Peer;

/// Room before the payload: the transport header.
pub const HEADROOM: usize = TRANSPORT_HEADER_LEN;
/// Room after the payload: up to 15 bytes of padding plus the tag.
pub const TAILROOM: usize = 16 + 16;
/// Most packets a batch carries; bounds the work one item represents.
pub const MAX_BATCH: usize = 64;

/// One packet in a buffer of its own. Plaintext lives at `buf[HEADROOM..HEADROOM+len]`;
/// a datagram (either direction) lives at `buf[..len]` with `at_header` set.
pub struct Packet {
    pub buf: Vec<u8>,
    pub len: usize,
    /// Transport counter (TX: assigned; RX: from the header).
    pub counter: u64,
    /// RX: the datagram's source. TX: unused.
    pub src: Option<SocketAddr>,
    /// Set by the crypt stage: the packet authenticated (RX) or was sealed (TX).
    pub ok: bool,
}

impl Packet {
    /// A buffer able to hold `payload` bytes of plaintext plus header and tag room.
    pub fn with_capacity(payload: usize) -> Packet {
        Packet {
            buf: vec![0; HEADROOM + payload + TAILROOM],
            len: 0,
            counter: 0,
            src: None,
            ok: false,
        }
    }

    pub fn plaintext(&self) -> &[u8] {
        &self.buf[HEADROOM..HEADROOM + self.len]
    }
}

/// Direction-specific contents of a batch.
pub struct BatchBody {
    pub packets: Vec<Packet>,
}

/// A unit of crypt work, also an element of its peer's ordered queue.
///
/// Ordering contract: the crypt worker that owns the body sets `done` with `SeqCst`
/// after its last write; the peer's serial stage reads the body only after it has
/// seen `done` (also `SeqCst`). The body's mutex is therefore never contended; it exists
/// so that handing the body from worker to serial stage needs no unsafe code.
pub struct Batch {
    pub peer: Arc<Peer>,
    pub keypair: Arc<Keypair>,
    done: AtomicBool,
    body: Mutex<BatchBody>,
}

impl Batch {
    pub fn new(peer: Arc<Peer>, keypair: Arc<Keypair>, packets: Vec<Packet>) -> Arc<Batch> {
        Arc::new(Batch {
            peer,
            keypair,
            done: AtomicBool::new(false),
            body: Mutex::new(BatchBody { packets }),
        })
    }

    pub fn body(&self) -> MutexGuard<'_, BatchBody> {
        self.body.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn mark_done(&self) {
        self.done.store(true, Ordering::SeqCst);
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    pub fn len(&self) -> usize {
        self.body().packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
