//! A transport keypair: the two ChaCha20-Poly1305 keys one handshake produced, the send
//! counter, and the receive replay window.
//!
//! Concurrency: a keypair is shared (`Arc`) between the serial stages and the parallel
//! crypt workers. Sealing and opening take `&self` and never lock, so any number of
//! workers can encrypt one peer's packets at once (each through its own [`Sealer`] or
//! [`Opener`], the key prepared once per batch). Counters are reserved with one atomic
//! add per batch. The replay window sits behind its own mutex, which only the peer's
//! ordered receive stage takes, after decryption.
//!
//! The replay window (1 KiB) is allocated when the first message authenticates, not
//! with the keypair: a responder's next keypair waits unconfirmed beside the current
//! one until the initiator uses it, and one that a newer handshake replaces first (a
//! retried initiation) never needs a window at all.

use crate::crypto::{AeadError, AeadKey, KEY_LEN, TAG_LEN};
use crate::handshake::SessionKeys;
use crate::messages::{TransportHeader, TRANSPORT_HEADER_LEN};
use crate::replay::ReplayWindow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - crate::replay::WINDOW_SIZE - 1;
pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
pub const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);

pub struct Keypair {
    /// The raw keys, not the AEAD library's prepared ones: a prepared key takes 544
    /// bytes (sized for AES-GCM's key schedule) where ChaCha20-Poly1305 needs these 32,
    /// and of a peer's three keypair slots (current, previous, next) two are filled at
    /// once, so prepared keys would cost about 20 MiB more at 10,000 peers.
    /// Preparing one is a copy, done per batch by [`Keypair::sealer`] and
    /// [`Keypair::opener`].
    send: [u8; KEY_LEN],
    recv: [u8; KEY_LEN],
    send_counter: AtomicU64,
    /// Cleared when the keypair is expired early (key change, peer removal).
    send_valid: AtomicBool,
    pub local_index: u32,
    pub remote_index: u32,
    pub created: Duration,
    pub is_initiator: bool,
    /// `None` until the first message authenticates (see the module comment).
    replay: Mutex<Option<Box<ReplayWindow>>>,
}

/// The keys are wiped when the last holder lets go (a rotation, the key-zeroing timer,
/// a removed peer), as the kernel frees keypairs with `kfree_sensitive`: freed
/// unwiped, they stayed in the heap after the session they protected was over. The
/// AEAD library's prepared copies ([`Keypair::sealer`], [`Keypair::opener`]) live for
/// one batch.
impl Drop for Keypair {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.send.zeroize();
        self.recv.zeroize();
    }
}

impl Keypair {
    pub fn new(keys: &SessionKeys, created: Duration) -> Self {
        Keypair {
            send: keys.send,
            recv: keys.recv,
            send_counter: AtomicU64::new(0),
            send_valid: AtomicBool::new(true),
            local_index: keys.local_index,
            remote_index: keys.remote_index,
            created,
            is_initiator: keys.is_initiator,
            replay: Mutex::new(None),
        }
    }

    /// Reserves `n` consecutive send counters; `None` once the keypair may no longer
    /// send (too old, too many messages, or expired early).
    pub fn reserve_counters(&self, n: u64, now: Duration) -> Option<u64> {
        if !self.can_send(now) {
            return None;
        }
        let first = self.send_counter.fetch_add(n, Ordering::Relaxed);
        if first.checked_add(n)? > REJECT_AFTER_MESSAGES {
            // Leave the counter past the limit so every later caller fails too.
            return None;
        }
        Some(first)
    }

    pub fn can_send(&self, now: Duration) -> bool {
        self.send_valid.load(Ordering::Relaxed)
            && now.saturating_sub(self.created) < REJECT_AFTER_TIME
            && self.send_counter.load(Ordering::Relaxed) < REJECT_AFTER_MESSAGES
    }

    pub fn can_receive(&self, now: Duration) -> bool {
        now.saturating_sub(self.created) < REJECT_AFTER_TIME
    }

    /// Messages sent so far (the next counter to use).
    pub fn sent_messages(&self) -> u64 {
        self.send_counter.load(Ordering::Relaxed)
    }

    pub fn expire(&self) {
        self.send_valid.store(false, Ordering::Relaxed);
    }

    /// Whether the sender side should start a new handshake (whitepaper §6.2).
    pub fn wants_rekey_on_send(&self, now: Duration) -> bool {
        self.send_valid.load(Ordering::Relaxed)
            && (self.sent_messages() > REKEY_AFTER_MESSAGES
                || (self.is_initiator && now.saturating_sub(self.created) >= REKEY_AFTER_TIME))
    }

    /// The send key prepared, for sealing many messages.
    pub fn sealer(&self) -> Sealer {
        Sealer {
            key: AeadKey::new(&self.send),
            receiver: self.remote_index,
        }
    }

    /// The receive key prepared, for opening many messages.
    pub fn opener(&self) -> Opener {
        Opener(AeadKey::new(&self.recv))
    }

    /// Seals one message (see [`Sealer::seal`]); for many, take a [`Sealer`].
    pub fn seal(&self, counter: u64, msg: &mut [u8]) {
        self.sealer().seal(counter, msg)
    }

    /// Opens one message (see [`Opener::open`]); for many, take an [`Opener`].
    pub fn open(&self, counter: u64, msg: &mut [u8]) -> Result<usize, AeadError> {
        self.opener().open(counter, msg)
    }

    /// Replay check, after successful decryption (ordered stage only).
    pub fn accept_counter(&self, counter: u64) -> bool {
        self.replay
            .lock()
            .expect("replay window lock poisoned")
            .get_or_insert_with(Box::default)
            .accept(counter)
    }
}

/// A keypair's send key, prepared: seals transport messages to its peer.
pub struct Sealer {
    key: AeadKey,
    receiver: u32,
}

impl Sealer {
    /// Encrypts a transport message in place. `msg` holds the 16-byte header room, the
    /// padded plaintext, and `TAG_LEN` bytes of tail room.
    pub fn seal(&self, counter: u64, msg: &mut [u8]) {
        TransportHeader {
            receiver: self.receiver,
            counter,
        }
        .write(msg);
        self.key
            .seal_in_place(counter, &[], &mut msg[TRANSPORT_HEADER_LEN..]);
    }
}

/// A keypair's receive key, prepared: opens transport messages from its peer.
pub struct Opener(AeadKey);

impl Opener {
    /// Decrypts a transport message in place; returns the plaintext length, which starts
    /// at `TRANSPORT_HEADER_LEN`.
    /// A message too short to hold a header and a tag fails like a forged one.
    pub fn open(&self, counter: u64, msg: &mut [u8]) -> Result<usize, AeadError> {
        let body = msg.get_mut(TRANSPORT_HEADER_LEN..).ok_or(AeadError)?;
        self.0.open_in_place(counter, &[], body)?;
        Ok(msg.len() - TRANSPORT_HEADER_LEN - TAG_LEN)
    }
}

#[cfg(test)]
impl Keypair {
    /// Moves the send counter forward without sending (to test message-count limits).
    pub(crate) fn skip_counters_for_test(&self, n: u64) {
        self.send_counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short input is refused, not a panic: callers classify first, but the opener
    /// must not rely on it.
    #[test]
    fn a_message_shorter_than_its_header_and_tag_fails_to_open() {
        let kp = keypair();
        for len in [0, 1, 15, 16, 31] {
            assert!(kp.open(0, &mut vec![4u8; len]).is_err(), "{len}");
        }
    }

    /// Dropped, a keypair leaves no key behind in its memory.
    #[test]
    fn a_dropped_keypair_wipes_its_keys() {
        let mut slot = std::mem::MaybeUninit::new(keypair());
        // SAFETY: the slot holds a live keypair, dropped once here; afterwards only its
        // two plain byte arrays are read, which drop leaves initialised.
        let (send, recv) = unsafe {
            std::ptr::drop_in_place(slot.as_mut_ptr());
            let p = slot.as_ptr();
            (
                std::ptr::addr_of!((*p).send).read(),
                std::ptr::addr_of!((*p).recv).read(),
            )
        };
        assert_eq!((send, recv), ([0; 32], [0; 32]));
    }

    fn keypair() -> Keypair {
        crate::sim::keypair(false)
    }

    fn holds_window(kp: &Keypair) -> bool {
        kp.replay.lock().unwrap().is_some()
    }

    #[test]
    fn the_replay_window_arrives_with_the_first_message() {
        let kp = keypair();
        assert!(!holds_window(&kp), "an unconfirmed keypair holds no window");
        let mut msg = vec![0u8; TRANSPORT_HEADER_LEN + 16 + TAG_LEN];
        kp.seal(5, &mut msg);
        assert_eq!(kp.open(5, &mut msg), Ok(16));
        assert!(kp.accept_counter(5));
        assert!(holds_window(&kp));
        // The window it made is the one later messages meet.
        assert!(!kp.accept_counter(5), "a replay");
        assert!(kp.accept_counter(4), "an earlier counter, once");
        assert!(!kp.accept_counter(4));
    }
}
