//! What one star run is asked to do (`StarSpec`): its direction, N, packet size and
//! load, its handshakes, its inner families and sink; what makes two runs comparable
//! (`Shape`); and the checks that refuse a run the lab cannot stage, with the reason.

use super::{generator, inner, sink, storm};
use crate::Result;
use serde::{Deserialize, Serialize};

/// The longest receive phase, s: it ends before the sessions its traffic was sealed
/// for do (see `validate`).
pub const MAX_PHASE_S: f64 = 170.0;
/// The longest transmit phase, s: the emulated peers rekey there, so only the lab's
/// patience bounds it.
pub const MAX_TX_PHASE_S: f64 = 3600.0;

/// The default cap on sealed traffic held in memory, MiB.
pub const DEFAULT_SEALED_MAX_MIB: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Way {
    /// Peers → gateway: the gateway decrypts.
    Rx,
    /// Gateway → peers: the gateway encrypts.
    Tx,
}

impl std::str::FromStr for Way {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "rx" => Ok(Way::Rx),
            "tx" => Ok(Way::Tx),
            _ => Err(format!("direction '{s}': rx (peers → gateway) or tx")),
        }
    }
}

impl std::fmt::Display for Way {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Way::Rx => "rx",
            Way::Tx => "tx",
        })
    }
}

/// One star run's shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StarSpec {
    pub peers: usize,
    pub way: Way,
    /// Inner packet size, bytes (IPv4 header included).
    pub size: usize,
    /// Offered load in packets per second over all peers; None: unlimited.
    pub offered_pps: Option<f64>,
    /// Length of the timed phase (paced runs; unlimited receive runs send what the cap
    /// on sealed packets holds).
    pub seconds: f64,
    /// Initiations per second during the handshake phase; None: all at once (a storm).
    pub handshake_rate: Option<f64>,
    /// Cap on the sealed traffic held in memory, MiB.
    pub sealed_max_mib: usize,
    /// All peers behind one outer address (a NAT), instead of one address each.
    #[serde(default)]
    pub shared_source: bool,
    /// Transmit: the generator opens every this-many-th message each peer receives
    /// (1: all of them, and then checks every sequence number).
    #[serde(default = "default_sample_every")]
    pub sample_every: u64,
    /// Peers configured beside the N that have no session before the phase and all
    /// initiate when it starts (`storm`); 0: none.
    #[serde(default)]
    pub storm_peers: usize,
    /// The inner packets' address families.
    #[serde(default)]
    pub family: inner::Family,
    /// Where the receive direction's packets end.
    #[serde(default)]
    pub sink: sink::SinkKind,
    /// Receive: the last this-many of the N peers are light, each sending
    /// `light_mbit` from a sender of their own, while the other (heavy) peers share
    /// `offered_pps`; their one-way delay and loss are reported apart. 0: none.
    #[serde(default)]
    pub light_peers: usize,
    /// Each light peer's rate, Mbit/s of inner packets.
    #[serde(default)]
    pub light_mbit: f64,
    /// Transmit: the session age at which a peer hearing data rekeys, s; None: the
    /// whitepaper's REJECT_AFTER_TIME − KEEPALIVE_TIMEOUT − REKEY_TIMEOUT (165 s).
    /// Shorter is still valid protocol; tests use it to rekey within a short phase.
    #[serde(default)]
    pub rekey_after_s: Option<f64>,
    /// Tunnels (interfaces) on the gateway, the peers spread over them: peer i on tunnel
    /// i mod T, each tunnel with its own key, listening port and peers. wirelane serves
    /// them from one process; the others run one process per tunnel, as their users must.
    #[serde(default = "one_tunnel")]
    pub tunnels: usize,
}

fn default_sample_every() -> u64 {
    64
}

fn one_tunnel() -> usize {
    1
}

/// The most tunnels one gateway run spreads its peers over.
pub const MAX_TUNNELS: usize = 64;

/// The largest sealed-packet cap a run may ask for, MiB (1 TiB), whatever the memory.
pub const MAX_SEALED_MIB: usize = 1 << 20;

/// The inner packet size a star run uses unless told otherwise (`--size`).
pub const DEFAULT_SIZE: usize = 1420;

/// What makes runs comparable: direction, N, offered load and whether the
/// handshakes came as a storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub way: Way,
    pub peers: usize,
    /// Offered packets per second, rounded (None: unlimited).
    pub offered_pps: Option<u64>,
    pub storm: bool,
    /// Peers storming during the phase.
    pub storm_peers: usize,
    pub family: inner::Family,
    pub sink: sink::SinkKind,
    /// Light peers among the N, and each one's rate in kbit/s.
    pub light: Option<(usize, u64)>,
    pub tunnels: usize,
    /// Inner packet size, bytes, and whether all peers share one outer source.
    pub size: usize,
    pub shared_source: bool,
}

impl Shape {
    /// Table order: direction, then N, tunnels, load, storm, family, sink, light
    /// peers, size and a shared source.
    #[allow(clippy::type_complexity)]
    pub fn order(
        &self,
    ) -> (
        (u8, usize, usize, u64, bool, usize),
        (u8, u8, Option<(usize, u64)>, usize, bool),
    ) {
        (
            (
                self.way as u8,
                self.peers,
                self.tunnels,
                self.offered_pps.unwrap_or(u64::MAX),
                self.storm,
                self.storm_peers,
            ),
            (
                self.family as u8,
                self.sink as u8,
                self.light,
                self.size,
                self.shared_source,
            ),
        )
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} N={}", self.way, self.peers)?;
        if self.tunnels > 1 {
            write!(f, " over {} tunnels", self.tunnels)?;
        }
        match self.offered_pps {
            Some(p) => write!(f, " {p} pps")?,
            None => f.write_str(" unlimited")?,
        }
        if self.storm {
            f.write_str(" storm")?;
        }
        if self.storm_peers > 0 {
            write!(f, " +{} storming", self.storm_peers)?;
        }
        if self.family != inner::Family::Ipv4 {
            write!(f, " {}", self.family)?;
        }
        if self.sink != sink::SinkKind::Socket {
            write!(f, " {} sink", self.sink)?;
        }
        if let Some((k, kbit)) = self.light {
            write!(f, " ({k} light at {} Mbit/s)", kbit as f64 / 1e3)?;
        }
        if self.size != DEFAULT_SIZE {
            write!(f, " {} B", self.size)?;
        }
        if self.shared_source {
            f.write_str(" one source")?;
        }
        Ok(())
    }
}

impl StarSpec {
    pub fn shape(&self) -> Shape {
        Shape {
            way: self.way,
            peers: self.peers,
            offered_pps: self.offered_pps.map(|p| p.round() as u64),
            storm: self.handshake_rate.is_none(),
            storm_peers: self.storm_peers,
            family: self.family,
            sink: self.sink,
            light: (self.light_peers > 0)
                .then(|| (self.light_peers, (self.light_mbit * 1e3).round() as u64)),
            tunnels: self.tunnels,
            size: self.size,
            shared_source: self.shared_source,
        }
    }

    /// The heavy peers: all but the light ones.
    pub fn heavy_peers(&self) -> usize {
        self.peers - self.light_peers.min(self.peers)
    }

    /// Each light peer's rate, packets per second.
    pub fn light_pps(&self) -> f64 {
        self.light_mbit * 1e6 / (8.0 * self.size as f64)
    }

    pub fn validate(&self) -> Result<()> {
        if !(1..=generator::MAX_PEERS).contains(&self.peers) {
            return Err(format!("star: peers must be 1..={}", generator::MAX_PEERS).into());
        }
        let min = self.family.max_header() + inner::UDP_HEADER + inner::MIN_PAYLOAD;
        if !(min..=generator::MTU).contains(&self.size) {
            return Err(format!("star: size must be {min}..={}", generator::MTU).into());
        }
        // Receive traffic is sealed before the phase for the sessions of the first
        // handshakes, which end at REJECT_AFTER_TIME (180 s); a longer phase would
        // measure a gateway refusing it all. In the transmit direction the peers rekey.
        match self.way {
            Way::Rx if !(0.1..=MAX_PHASE_S).contains(&self.seconds) => {
                return Err(format!(
                    "star: receive phases must be 0.1..={MAX_PHASE_S} s (their traffic is \
                     sealed ahead for sessions that end 180 s after the handshakes)"
                )
                .into());
            }
            Way::Tx if !(0.1..=MAX_TX_PHASE_S).contains(&self.seconds) => {
                return Err(
                    format!("star: transmit phases must be 0.1..={MAX_TX_PHASE_S} s").into(),
                );
            }
            _ => {}
        }
        if self
            .offered_pps
            .is_some_and(|r| !(r.is_finite() && r >= 1.0))
        {
            return Err("star: the offered rate must be at least 1 packet per second".into());
        }
        if let Some(r) = self.rekey_after_s {
            if self.way != Way::Tx || !(r.is_finite() && r >= 0.1) {
                return Err(
                    "star: rekey_after_s is for the transmit direction, at least 0.1 s".into(),
                );
            }
        }
        if self
            .handshake_rate
            .is_some_and(|r| !(r.is_finite() && r >= 1.0))
        {
            return Err("star: the handshake rate must be at least 1 per second".into());
        }
        if self.sample_every == 0 {
            return Err("star: sample_every must be at least 1".into());
        }
        if !(1..=MAX_SEALED_MIB).contains(&self.sealed_max_mib) {
            return Err(format!(
                "star: the sealed-packet cap must be 1..={MAX_SEALED_MIB} MiB, not {}",
                self.sealed_max_mib
            )
            .into());
        }
        if self.sink == sink::SinkKind::Blackhole && self.way != Way::Rx {
            return Err("star: the blackhole sink is for the receive direction".into());
        }
        if self.light_peers > 0 {
            if self.light_peers >= self.peers {
                return Err("star: light peers must leave at least one heavy peer".into());
            }
            if self.way != Way::Rx || self.sink != sink::SinkKind::Socket {
                return Err(
                    "star: light peers are measured in the receive direction, at the socket \
                     sink (their delay is what they report)"
                        .into(),
                );
            }
            if self.offered_pps.is_none() {
                return Err(
                    "star: light peers need the heavy peers paced (an offered rate), so that \
                     both send over the same phase"
                        .into(),
                );
            }
            if !(self.light_mbit.is_finite() && self.light_pps() * self.seconds >= 1.0) {
                return Err(
                    "star: each light peer's rate must send at least one packet in the phase"
                        .into(),
                );
            }
        }
        if !(1..=MAX_TUNNELS).contains(&self.tunnels) || self.tunnels > self.peers {
            return Err(format!(
                "star: tunnels must be 1..={MAX_TUNNELS} and at most the peers ({})",
                self.peers
            )
            .into());
        }
        if self.storm_peers > 0 && self.shared_source {
            return Err("star: a storm during the phase needs a source address per peer".into());
        }
        storm::check(self.peers, self.storm_peers)
    }

    /// Packets each heavy peer and each light peer sends in a receive run, within the
    /// cap on sealed memory, and within half the memory available now: the packets are
    /// sealed after the namespaces and the gateway exist, where running out would leave
    /// them behind.
    pub(crate) fn per_peer(&self) -> Result<(usize, usize)> {
        let (per_peer, light) = self.per_peer_within_cap()?;
        let outer = generator::message_len(self.size) as u128;
        let bytes = (per_peer as u128 * self.heavy_peers().max(1) as u128
            + light as u128 * self.light_peers as u128)
            * outer;
        if let Some(kib) = crate::cpu::mem_available_kib() {
            let room = kib as u128 * 1024 / 2;
            if bytes > room {
                return Err(format!(
                    "star: this run would seal {} MiB of packets, more than half the memory \
                     available now ({} MiB): shorten it, lower the rate, or lower \
                     --sealed-max-mib",
                    bytes >> 20,
                    room >> 20
                )
                .into());
            }
        }
        Ok((per_peer, light))
    }

    fn per_peer_within_cap(&self) -> Result<(usize, usize)> {
        let outer = generator::message_len(self.size);
        // Bounded by `validate`; sums and products below in u128, which a rate or a
        // phase of any size (float casts saturate) cannot overflow.
        let cap = self.sealed_max_mib.min(MAX_SEALED_MIB) << 20;
        let heavy = self.heavy_peers().max(1);
        let light = match self.light_peers {
            0 => 0,
            _ => (self.light_pps() * self.seconds).ceil() as usize,
        };
        let light_bytes = light as u128 * self.light_peers as u128 * outer as u128;
        let too_big = |need: u128| need > cap as u128;
        match self.offered_pps {
            Some(r) => {
                let per_peer = ((r * self.seconds / heavy as f64).ceil() as usize).max(1);
                let need = per_peer as u128 * heavy as u128 * outer as u128 + light_bytes;
                if too_big(need) {
                    return Err(format!(
                        "star: this run needs {} MiB of sealed packets ({heavy} peers × \
                         {per_peer} packets × {outer} bytes, and {light_bytes} bytes for the \
                         light peers), more than the cap of {} MiB: shorten it, lower the \
                         rate, or raise --sealed-max-mib",
                        need >> 20,
                        self.sealed_max_mib
                    )
                    .into());
                }
                Ok((per_peer, light))
            }
            None => {
                if too_big(light_bytes) {
                    return Err(format!(
                        "star: the light peers alone need {} MiB of sealed packets, more than \
                         the cap of {} MiB",
                        light_bytes >> 20,
                        self.sealed_max_mib
                    )
                    .into());
                }
                let per_peer = (cap as u128 - light_bytes) as usize / (heavy * outer);
                if per_peer == 0 {
                    return Err(format!(
                        "star: {} MiB of sealed packets cannot hold one packet per peer for \
                         {heavy} peers; raise --sealed-max-mib",
                        self.sealed_max_mib
                    )
                    .into());
                }
                Ok((per_peer, light))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: serde_json::Value) -> StarSpec {
        let mut v = serde_json::json!({
            "peers": 10, "way": "rx", "size": 1420, "offered_pps": null,
            "seconds": 3.0, "handshake_rate": null, "sealed_max_mib": 64,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    /// Sizes from the command line that overflowed (a panic in a test build, nonsense
    /// in a release one) or asked for more memory than there is are refused.
    #[test]
    fn oversized_runs_are_refused_not_overflowed() {
        assert!(spec(serde_json::json!({})).per_peer().is_ok());
        let fast = spec(serde_json::json!({ "offered_pps": 1e300 }));
        let e = fast.per_peer().unwrap_err().to_string();
        assert!(e.contains("more than the cap"), "{e}");
        let huge_cap = spec(serde_json::json!({ "sealed_max_mib": 1usize << 44 }));
        let e = huge_cap.validate().unwrap_err().to_string();
        assert!(e.contains("sealed-packet cap"), "{e}");
        // Unlimited fills the cap: a cap past what this machine has is refused.
        let all = spec(serde_json::json!({ "sealed_max_mib": MAX_SEALED_MIB }));
        let e = all.per_peer().unwrap_err().to_string();
        assert!(e.contains("half the memory"), "{e}");
        assert!(storm::check(10, usize::MAX).is_err());
    }
}
