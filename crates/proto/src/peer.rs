//! Everything the protocol keeps per peer: the handshake, the cookie generator, the
//! current/previous/next keypairs, and the timers that drive rekeying, keepalives and
//! key zeroing. Methods take a [`Ctx`] (time, randomness, our identity, the index table)
//! and push [`Output`]s for the caller to carry out; the type itself does no I/O.
//!
//! Keypair rotation follows the kernel:
//! - the initiator promotes its new keypair to `current` as soon as the response
//!   authenticates;
//! - the responder parks its new keypair in `next` and promotes it only when the first
//!   transport packet under it authenticates, which proves the initiator has it too.
//!
//! Invariant: every receiver index this peer holds (in-flight initiation, current,
//! previous, next) is registered in the caller's index table, and released through
//! `Ctx::indices` the moment it is dropped here.

use crate::cookie::{CookieError, CookieGenerator};
use crate::handshake::{
    Handshake, HandshakeError, InitiationPhase1, LocalIdentity, ResponseWork, SessionKeys,
};
use crate::keypair::{Keypair, REJECT_AFTER_TIME};
use crate::messages::{CookieReply, Response, INITIATION_LEN};
use crate::timers::*;
use rand_core::RngCore;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Source and sink of the receiver indices that name our sessions on the wire.
pub trait IndexTable {
    /// Returns a fresh index, unused by any other session of this interface, already
    /// mapped to the peer this table was handed out for.
    fn allocate(&mut self) -> u32;
    fn release(&mut self, index: u32);
}

/// Everything a protocol step may need from the outside world.
pub struct Ctx<'a> {
    /// Monotonic time since an arbitrary origin.
    pub now: Duration,
    /// Wall-clock time since the Unix epoch (TAI64N timestamps, last handshake time).
    pub wall: Duration,
    pub rng: &'a mut dyn RngCore,
    /// Our static identity; `None` while no private key is configured.
    pub local: Option<&'a LocalIdentity>,
    pub indices: &'a mut dyn IndexTable,
}

impl Ctx<'_> {
    fn jitter(&mut self) -> Duration {
        let max = REKEY_TIMEOUT_JITTER_MAX.as_micros() as u64;
        Duration::from_micros(self.rng.next_u64() % (max + 1))
    }
}

/// Work a protocol step asks its caller to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    /// Send this handshake initiation to the peer's endpoint.
    Initiation {
        reason: InitiationReason,
        message: Vec<u8>,
    },
    /// Send this handshake response to the peer's endpoint.
    Handshake(Vec<u8>),
    /// Send the staged packets; if none are staged and `keepalive_if_empty`, a
    /// keepalive (through the normal transmit path). Asked for when a session became
    /// usable, and for every keepalive ([`Output::keepalive`]): staged packets serve
    /// as one (the kernel's rule); stacked on them, each retry's keepalive was staged
    /// too, crowding out data.
    SendStaged { keepalive_if_empty: bool },
    /// Handshake attempts ran out: drop the staged packets.
    DropStaged,
}

impl Output {
    /// A keepalive, unless packets are staged: they go instead.
    pub fn keepalive() -> Output {
        Output::SendStaged {
            keepalive_if_empty: true,
        }
    }
}

pub struct PeerState {
    handshake: Handshake,
    cookies: CookieGenerator,
    current: Option<Arc<Keypair>>,
    previous: Option<Arc<Keypair>>,
    next: Option<Arc<Keypair>>,
    timers: Timers,
    last_sent_handshake: Option<Duration>,
    handshake_attempts: u32,
    /// The initiation in flight, while a cookie reply may still send it again (once).
    resendable: Option<Box<[u8; INITIATION_LEN]>>,
    sent_lastminute_handshake: bool,
    persistent_keepalive: u16,
    endpoint: Option<SocketAddr>,
    last_handshake_wall: Option<Duration>,
}

fn release(ctx: &mut Ctx, kp: Option<Arc<Keypair>>) {
    if let Some(kp) = kp {
        ctx.indices.release(kp.local_index);
    }
}

impl PeerState {
    pub fn new(remote_static: [u8; 32], psk: [u8; 32]) -> Self {
        PeerState {
            cookies: CookieGenerator::new(&remote_static),
            handshake: Handshake::new(remote_static, psk),
            current: None,
            previous: None,
            next: None,
            timers: Timers::default(),
            last_sent_handshake: None,
            handshake_attempts: 0,
            resendable: None,
            sent_lastminute_handshake: false,
            persistent_keepalive: 0,
            endpoint: None,
            last_handshake_wall: None,
        }
    }

    pub fn remote_static(&self) -> &[u8; 32] {
        &self.handshake.remote_static
    }
    pub fn psk(&self) -> &[u8; 32] {
        self.handshake.psk()
    }
    pub fn set_psk(&mut self, psk: [u8; 32]) {
        self.handshake.set_psk(psk);
    }
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }
    pub fn set_endpoint(&mut self, ep: SocketAddr) {
        self.endpoint = Some(ep);
    }
    pub fn persistent_keepalive(&self) -> u16 {
        self.persistent_keepalive
    }
    /// Wall-clock time of the last completed handshake.
    pub fn last_handshake(&self) -> Option<Duration> {
        self.last_handshake_wall
    }
    pub fn next_deadline(&self) -> Option<Duration> {
        self.timers.next_deadline()
    }
    pub fn timers(&self) -> &Timers {
        &self.timers
    }
    pub fn current_keypair(&self) -> Option<&Arc<Keypair>> {
        self.current.as_ref()
    }
    /// Whether a cookie reply could be taken now (see `CookieGenerator::awaits_reply`).
    pub fn awaits_cookie_reply(&self) -> bool {
        self.cookies.awaits_reply()
    }

    pub fn handshake_attempts(&self) -> u32 {
        self.handshake_attempts
    }

    /// Every index this peer holds, for releasing them all when it is removed.
    pub fn indices(&self) -> Vec<u32> {
        let mut v: Vec<u32> = [&self.current, &self.previous, &self.next]
            .into_iter()
            .flatten()
            .map(|k| k.local_index)
            .collect();
        v.extend(self.handshake.pending_index());
        v
    }

    // --- timer events, named after the kernel's hooks ---

    fn any_authenticated_sent(&mut self) {
        self.timers.send_keepalive = None;
    }
    fn any_authenticated_received(&mut self) {
        self.timers.new_handshake = None;
    }
    fn any_authenticated_traversal(&mut self, now: Duration) {
        if self.persistent_keepalive > 0 {
            self.timers.persistent_keepalive =
                Some(now + Duration::from_secs(self.persistent_keepalive.into()));
        }
    }
    fn data_sent(&mut self, ctx: &mut Ctx) {
        if self.timers.new_handshake.is_none() {
            self.timers.new_handshake =
                Some(ctx.now + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT + ctx.jitter());
        }
    }
    fn data_received(&mut self, now: Duration) {
        if self.timers.send_keepalive.is_none() {
            self.timers.send_keepalive = Some(now + KEEPALIVE_TIMEOUT);
        } else {
            self.timers.need_another_keepalive = true;
        }
    }
    fn handshake_complete(&mut self, wall: Duration) {
        self.timers.retransmit_handshake = None;
        self.handshake_attempts = 0;
        self.sent_lastminute_handshake = false;
        self.last_handshake_wall = Some(wall);
    }
    fn session_derived(&mut self, now: Duration) {
        self.timers.zero_key_material = Some(now + 3 * REJECT_AFTER_TIME);
    }

    /// Starts (or retries) a handshake. At most one initiation per REKEY_TIMEOUT, and
    /// none within REKEY_TIMEOUT of a response we sent (the kernel's rule): a responder
    /// with data for the initiator waits for its first packet (key confirmation)
    /// instead of starting a second handshake. A retry held back so is tried again a
    /// REKEY_TIMEOUT after that response, rather than never (the kernel's would wait
    /// for new data).
    pub fn initiate(&mut self, ctx: &mut Ctx, reason: InitiationReason, out: &mut Vec<Output>) {
        if reason != InitiationReason::Retry {
            self.handshake_attempts = 0;
        }
        if let Some(t) = self.last_sent_handshake {
            if ctx.now < t + REKEY_TIMEOUT {
                if reason == InitiationReason::Retry {
                    self.timers.retransmit_handshake = Some(t + REKEY_TIMEOUT + ctx.jitter());
                }
                return;
            }
        }
        self.send_initiation(ctx, reason, out);
    }

    /// Builds, stamps and queues a fresh initiation, and arms its retry timer.
    fn send_initiation(&mut self, ctx: &mut Ctx, reason: InitiationReason, out: &mut Vec<Output>) {
        let Some(local) = ctx.local else { return };
        let index = ctx.indices.allocate();
        let (msg, replaced) = match self
            .handshake
            .create_initiation(local, index, ctx.wall, ctx.rng)
        {
            Ok(r) => r,
            Err(_) => {
                ctx.indices.release(index);
                return;
            }
        };
        if let Some(old) = replaced {
            ctx.indices.release(old);
        }
        let mut bytes = msg.to_bytes();
        self.cookies.stamp(&mut bytes, ctx.now);
        self.resendable = Some(Box::new(bytes));
        self.last_sent_handshake = Some(ctx.now);
        self.any_authenticated_traversal(ctx.now);
        self.any_authenticated_sent();
        self.timers.retransmit_handshake = Some(ctx.now + REKEY_TIMEOUT + ctx.jitter());
        out.push(Output::Initiation {
            reason,
            message: bytes.to_vec(),
        });
    }

    /// Finishes an initiation addressed to this peer (phase two) and answers it.
    pub fn consume_initiation(
        &mut self,
        ctx: &mut Ctx,
        phase1: InitiationPhase1,
        src: SocketAddr,
        out: &mut Vec<Output>,
    ) -> Result<(), HandshakeError> {
        let local = ctx.local.ok_or(HandshakeError::NoPrivateKey)?;
        let index = ctx.indices.allocate();
        let (resp, keys, replaced) = match self
            .handshake
            .consume_initiation_and_respond(local, phase1, index, ctx.now, ctx.rng)
        {
            Ok(r) => r,
            Err(e) => {
                ctx.indices.release(index);
                return Err(e);
            }
        };
        if let Some(old) = replaced {
            ctx.indices.release(old);
        }
        self.endpoint = Some(src);
        self.any_authenticated_received();
        self.any_authenticated_traversal(ctx.now);

        // As responder the new keypair waits in `next` until the initiator uses it.
        let kp = Arc::new(Keypair::new(&keys, ctx.now));
        let old_next = self.next.replace(kp);
        release(ctx, old_next);
        let old_prev = self.previous.take();
        release(ctx, old_prev);
        self.session_derived(ctx.now);

        let mut bytes = resp.to_bytes();
        self.cookies.stamp(&mut bytes, ctx.now);
        self.last_sent_handshake = Some(ctx.now);
        self.any_authenticated_traversal(ctx.now);
        self.any_authenticated_sent();
        out.push(Output::Handshake(bytes.to_vec()));
        Ok(())
    }

    /// Consumes the response to our initiation.
    pub fn consume_response(
        &mut self,
        ctx: &mut Ctx,
        msg: &Response,
        src: SocketAddr,
        out: &mut Vec<Output>,
    ) -> Result<(), HandshakeError> {
        let local = ctx.local.ok_or(HandshakeError::NoPrivateKey)?;
        let keys = self.response_work(msg)?.compute(local, msg)?;
        self.complete_response(ctx, keys, src, out)
    }

    /// A response's work, copied out of the initiation in flight, to be computed
    /// without this state's lock (see [`crate::handshake::Handshake::response_work`])
    /// and handed to [`PeerState::complete_response`].
    pub fn response_work(&self, msg: &Response) -> Result<ResponseWork, HandshakeError> {
        self.handshake.response_work(msg)
    }

    /// Takes the keys a response yielded, if the initiation it answers is still the
    /// one in flight, as [`PeerState::consume_response`] would have.
    pub fn complete_response(
        &mut self,
        ctx: &mut Ctx,
        keys: SessionKeys,
        src: SocketAddr,
        out: &mut Vec<Output>,
    ) -> Result<(), HandshakeError> {
        self.handshake.finish_response(&keys)?;
        self.endpoint = Some(src);
        self.any_authenticated_received();
        self.any_authenticated_traversal(ctx.now);

        let kp = Arc::new(Keypair::new(&keys, ctx.now));
        let old_prev = if let Some(next) = self.next.take() {
            let old_current = self.current.take();
            release(ctx, old_current);
            self.previous.replace(next)
        } else {
            let cur = self.current.take();
            std::mem::replace(&mut self.previous, cur)
        };
        release(ctx, old_prev);
        self.current = Some(kp);
        self.session_derived(ctx.now);
        self.handshake_complete(ctx.wall);
        out.push(Output::SendStaged {
            keepalive_if_empty: true,
        });
        Ok(())
    }

    /// Takes the cookie out of a reply to our last handshake message.
    ///
    /// If the reply answers the initiation in flight, that same initiation (index,
    /// ephemeral, timestamp) is sent again at once, now with a mac2, rather than a new
    /// one when the retry timer fires: a responder under load answers a mac1-only
    /// initiation with nothing but a cookie, so waiting would add REKEY_TIMEOUT to
    /// every session set up while it is loaded. The kernel and wireguard-go wait.
    ///
    /// Why the same message: mac1 is visible on the wire, so anyone on the path who
    /// knows the responder's public key can forge a reply that opens. A new initiation
    /// would abandon the one in flight, whose response may already be on its way, and
    /// the responder would refuse the new one as a replay or a flood (same timestamp
    /// granule, within 20 ms): a forger could keep the tunnel down for good. The same
    /// message leaves the handshake in flight as it was; a responder that answered it
    /// already refuses the copy as a replay, and its response still completes it.
    ///
    /// Bound: once per initiation sent; a forger gets one extra datagram out of us per
    /// REKEY_TIMEOUT, not one per reply.
    pub fn consume_cookie_reply(
        &mut self,
        ctx: &mut Ctx,
        reply: &CookieReply,
        out: &mut Vec<Output>,
    ) -> Result<(), CookieError> {
        self.cookies.consume_reply(reply, ctx.now)?;
        if self.handshake.pending_index() != Some(reply.receiver) {
            return Ok(());
        }
        if let Some(mut bytes) = self.resendable.take() {
            // The same message (index, ephemeral, timestamp), now with a mac2.
            self.cookies.stamp_mac2(&mut bytes[..], ctx.now);
            self.any_authenticated_traversal(ctx.now);
            self.any_authenticated_sent();
            out.push(Output::Initiation {
                reason: InitiationReason::CookieReply,
                message: bytes.to_vec(),
            });
        }
        Ok(())
    }

    /// Reserves `n` send counters on the current keypair. `None` means no session can
    /// send: the caller stages the packets; a handshake has been started if allowed.
    pub fn prepare_send(
        &mut self,
        ctx: &mut Ctx,
        n: u64,
        out: &mut Vec<Output>,
    ) -> Option<(Arc<Keypair>, u64)> {
        let reserved = self
            .current
            .as_ref()
            .and_then(|kp| kp.reserve_counters(n, ctx.now).map(|c| (kp.clone(), c)));
        let reason = match (&reserved, &self.current) {
            (Some((kp, _)), _) if kp.wants_rekey_on_send(ctx.now) => InitiationReason::RekeyOnSend,
            (Some(_), _) => return reserved,
            (None, Some(_)) => InitiationReason::SessionExpired,
            (None, None) => InitiationReason::NoSession,
        };
        self.initiate(ctx, reason, out);
        reserved
    }

    /// Whether the current keypair can send right now.
    pub fn can_send(&self, now: Duration) -> bool {
        self.current.as_ref().is_some_and(|kp| kp.can_send(now))
    }

    /// The keypair a transport message addressed to `local_index` must be opened with.
    pub fn keypair_for(&self, local_index: u32, now: Duration) -> Option<Arc<Keypair>> {
        [&self.current, &self.next, &self.previous]
            .into_iter()
            .flatten()
            .find(|k| k.local_index == local_index && k.can_receive(now))
            .cloned()
    }

    /// Bookkeeping after transport packets were sent (`data` false for keepalives only).
    pub fn on_sent(&mut self, ctx: &mut Ctx, data: bool) {
        self.any_authenticated_traversal(ctx.now);
        self.any_authenticated_sent();
        if data {
            self.data_sent(ctx);
        }
    }

    /// Bookkeeping after a transport packet authenticated and passed the replay check:
    /// roams the endpoint, confirms a pending `next` keypair, and drives the timers.
    pub fn on_authenticated_transport(
        &mut self,
        ctx: &mut Ctx,
        kp: &Arc<Keypair>,
        src: SocketAddr,
        data: bool,
        out: &mut Vec<Output>,
    ) {
        self.endpoint = Some(src);
        if self.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, kp)) {
            let next = self.next.take();
            let old_current = std::mem::replace(&mut self.current, next);
            let old_prev = std::mem::replace(&mut self.previous, old_current);
            release(ctx, old_prev);
            self.handshake_complete(ctx.wall);
            out.push(Output::SendStaged {
                keepalive_if_empty: false,
            });
        }
        // Keep the key fresh from the receiving side: an initiator whose session nears
        // rejection age starts one last handshake.
        if !self.sent_lastminute_handshake {
            if let Some(cur) = &self.current {
                let limit = REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT;
                if cur.is_initiator
                    && cur.can_send(ctx.now)
                    && ctx.now.saturating_sub(cur.created) >= limit
                {
                    self.sent_lastminute_handshake = true;
                    self.initiate(ctx, InitiationReason::RekeyOnReceive, out);
                }
            }
        }
        self.any_authenticated_received();
        self.any_authenticated_traversal(ctx.now);
        if data {
            self.data_received(ctx.now);
        }
    }

    /// Runs every timer due at `ctx.now`.
    pub fn tick(&mut self, ctx: &mut Ctx, out: &mut Vec<Output>) {
        let fired = self.timers.expired(ctx.now);
        if fired.retransmit_handshake {
            if self.handshake_attempts > MAX_TIMER_HANDSHAKES {
                // Give up: drop what waited for this handshake, and make sure the keys
                // are wiped eventually even if no session ever existed. As the kernel
                // (`wg_expired_retransmit_handshake`), the initiation in flight stays
                // until then: a late response to it still completes the handshake. A
                // cookie reply no longer resends it.
                self.timers.send_keepalive = None;
                out.push(Output::DropStaged);
                self.resendable = None;
                if self.timers.zero_key_material.is_none() {
                    self.timers.zero_key_material = Some(ctx.now + 3 * REJECT_AFTER_TIME);
                }
            } else {
                self.handshake_attempts += 1;
                self.initiate(ctx, InitiationReason::Retry, out);
            }
        }
        if fired.send_keepalive {
            out.push(Output::keepalive());
            if self.timers.need_another_keepalive {
                self.timers.need_another_keepalive = false;
                self.timers.send_keepalive = Some(ctx.now + KEEPALIVE_TIMEOUT);
            }
        }
        if fired.new_handshake {
            self.initiate(ctx, InitiationReason::Unanswered, out);
        }
        if fired.zero_key_material {
            self.zero_key_material(ctx);
        }
        if fired.persistent_keepalive {
            out.push(Output::keepalive());
        }
    }

    /// Forgets every session and handshake (timer expiry, or an administrative reset).
    pub fn zero_key_material(&mut self, ctx: &mut Ctx) {
        for kp in [self.current.take(), self.previous.take(), self.next.take()] {
            release(ctx, kp);
        }
        if let Some(i) = self.handshake.clear() {
            ctx.indices.release(i);
        }
    }

    /// The interface went down (`ip link set down`): every session and handshake goes,
    /// and no timer runs until something new arms one, as the kernel's `wg_stop` leaves
    /// a peer. What was staged is the caller's to drop.
    pub fn interface_down(&mut self, ctx: &mut Ctx) {
        self.zero_key_material(ctx);
        self.timers.clear();
        self.handshake_attempts = 0;
        self.resendable = None;
        self.last_sent_handshake = None;
    }

    /// Our private key changed: sessions derived from the old key may not send anymore.
    pub fn local_identity_changed(&mut self, ctx: &mut Ctx) {
        if let Some(i) = self.handshake.local_identity_changed() {
            ctx.indices.release(i);
        }
        for kp in [&self.current, &self.next].into_iter().flatten() {
            kp.expire();
        }
        self.last_sent_handshake = None;
    }

    /// Sets the persistent keepalive interval (0 disables); enabling it sends one now.
    pub fn set_persistent_keepalive(&mut self, secs: u16, out: &mut Vec<Output>) {
        // One keepalive when it is turned on, not on a change of interval, as in the
        // kernel: the timer already runs.
        let turned_on = self.persistent_keepalive == 0 && secs != 0;
        self.persistent_keepalive = secs;
        if secs == 0 {
            self.timers.persistent_keepalive = None;
        } else if turned_on {
            out.push(Output::keepalive());
        }
    }
}
