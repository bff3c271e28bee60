//! The pipeline's stages, one per file, in the order of design.md §4:
//!
//! TX: tun_read → route → nonce → encrypt (parallel) → tx_flush (per-peer ordered)
//! RX: udp_recv → classify → decrypt (parallel) → rx_deliver (per-peer ordered)
//! and beside them: gate (handshake messages, on the UDP reader) → handshake (its own
//! bounded queue and thread), and timers.
//!
//! Each stage is a plain function over the shared [`crate::device::Device`], so any
//! execution model, or a test, can drive it.

pub mod classify;
pub mod decrypt;
pub mod encrypt;
pub mod gate;
pub mod handshake;
pub mod nonce;
pub mod route;
pub mod rx_deliver;
pub mod timers;
pub mod tun_read;
pub mod tx_flush;
pub mod udp_recv;
