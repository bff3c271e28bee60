//! Interface-wide counters. Relaxed atomics: they are statistics, not synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counters once: the struct, and `fields()` listing them by name (for the
/// UAPI `stats` operation and the shutdown log).
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        #[derive(Default, Debug)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl Stats {
            /// Every counter with its name, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters! {
    /// Packets read from the TUN with no peer routing their destination.
    tx_no_route,
    /// ICMP/ICMPv6 destination-unreachable errors written back for them.
    tx_icmp_unreachable,
    /// Errors not sent for the rate limit.
    tx_icmp_rate_limited,
    /// Our own outer datagrams routed back into the TUN (a routing loop), dropped.
    tx_routing_loop,
    /// Packets dropped on transmit: queue full, staged overflow, handshake gave up.
    tx_dropped,
    /// Datagrams that could not be sent because the peer has no endpoint.
    tx_no_endpoint,
    /// Datagrams that are not WireGuard messages at all.
    rx_malformed,
    /// Transport messages for an unknown receiver index or an expired keypair.
    rx_unknown_index,
    /// Transport messages that failed authentication.
    rx_auth_failed,
    /// Transport messages refused by the replay window.
    rx_replayed,
    /// Inner packets whose source address the sending peer is not allowed to use.
    rx_bad_source,
    /// Inner packets that are not well-formed IPv4 or IPv6.
    rx_bad_inner,
    /// Packets the kernel refused to take from a TUN write.
    rx_tun_write_failed,
    /// Received transport messages dropped because the peer's queue was full.
    rx_queue_full,
    /// Handshake messages dropped because the handshake queue was full.
    handshake_queue_full,
    /// Handshake messages dropped for an invalid mac1 (no DH spent on them).
    handshake_invalid_mac1,
    /// Handshake messages dropped by the per-source rate limit.
    handshake_rate_limited,
    /// Cookie replies sent while under load.
    cookie_replies_sent,
    /// Cookie replies dropped unsent: no room in the socket buffer, or no socket of the
    /// destination's family.
    cookie_replies_unsent,
    /// Handshake messages that authenticated with mac1 but failed later.
    handshake_failed,
    /// Handshakes completed here: initiations answered with a response, and responses
    /// consumed (each derives a new keypair; a rekey counts once per side).
    handshakes_completed,
    /// Diffie-Hellman operations spent on received handshake messages.
    handshake_dh,
    /// Serial-stage invocations and the batches they handled (EoI signatures).
    serial_runs,
    serial_batches,
    serial_empty_runs,
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
