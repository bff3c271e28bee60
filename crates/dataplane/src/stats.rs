//! Interface-wide counters. Relaxed atomics: they are statistics, not synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default, Debug)]
pub struct Stats {
    /// Packets read from the TUN with no peer routing their destination.
    pub tx_no_route: AtomicU64,
    /// Packets dropped on transmit: queue full, staged overflow, handshake gave up.
    pub tx_dropped: AtomicU64,
    /// Datagrams that could not be sent because the peer has no endpoint.
    pub tx_no_endpoint: AtomicU64,
    /// Datagrams that are not WireGuard messages at all.
    pub rx_malformed: AtomicU64,
    /// Transport messages for an unknown receiver index or an expired keypair.
    pub rx_unknown_index: AtomicU64,
    /// Transport messages that failed authentication.
    pub rx_auth_failed: AtomicU64,
    /// Transport messages refused by the replay window.
    pub rx_replayed: AtomicU64,
    /// Inner packets whose source address the sending peer is not allowed to use.
    pub rx_bad_source: AtomicU64,
    /// Inner packets that are not well-formed IPv4 or IPv6.
    pub rx_bad_inner: AtomicU64,
    /// Writes to the TUN that the kernel refused (each may hold many packets).
    pub rx_tun_write_failed: AtomicU64,
    /// Received transport messages dropped because the peer's queue was full.
    pub rx_queue_full: AtomicU64,
    /// Handshake messages dropped because the handshake queue was full.
    pub handshake_queue_full: AtomicU64,
    /// Handshake messages dropped for an invalid mac1 (no DH spent on them).
    pub handshake_invalid_mac1: AtomicU64,
    /// Handshake messages dropped by the per-source rate limit.
    pub handshake_rate_limited: AtomicU64,
    /// Cookie replies sent while under load.
    pub cookie_replies_sent: AtomicU64,
    /// Handshake messages that authenticated with mac1 but failed later.
    pub handshake_failed: AtomicU64,
    /// Diffie-Hellman operations spent on received handshake messages.
    pub handshake_dh: AtomicU64,
    /// Serial-stage invocations and the batches they handled (EoI signatures).
    pub serial_runs: AtomicU64,
    pub serial_batches: AtomicU64,
    pub serial_empty_runs: AtomicU64,
}

impl Stats {
    /// Records one serial-stage invocation that handled `batches` batches.
    pub fn record_serial_run(&self, batches: usize) {
        self.serial_runs.fetch_add(1, Ordering::Relaxed);
        self.serial_batches
            .fetch_add(batches as u64, Ordering::Relaxed);
        if batches == 0 {
            self.serial_empty_runs.fetch_add(1, Ordering::Relaxed);
        }
    }
}
