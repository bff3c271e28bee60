//! Per-peer protocol timers (whitepaper §6, as the kernel's timers.c arms them), as
//! plain deadlines. The owner feeds events in and calls [`Timers::expired`] with the
//! current time; nothing here reads a clock. [`InitiationReason`] names the rule, timer
//! or other, that started a handshake.

use std::time::Duration;

pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
pub const REKEY_ATTEMPT_TIME: Duration = Duration::from_secs(90);
/// Retransmissions before giving up: REKEY_ATTEMPT_TIME / REKEY_TIMEOUT.
pub const MAX_TIMER_HANDSHAKES: u32 = 18;
/// Upper bound of the random jitter added to handshake timers (a third of a second).
pub const REKEY_TIMEOUT_JITTER_MAX: Duration = Duration::from_millis(333);

/// Which timers fired.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    pub retransmit_handshake: bool,
    pub send_keepalive: bool,
    pub new_handshake: bool,
    pub zero_key_material: bool,
    pub persistent_keepalive: bool,
}

#[derive(Debug, Default, Clone)]
pub struct Timers {
    pub retransmit_handshake: Option<Duration>,
    pub send_keepalive: Option<Duration>,
    pub new_handshake: Option<Duration>,
    pub zero_key_material: Option<Duration>,
    pub persistent_keepalive: Option<Duration>,
    /// Data arrived while a keepalive was already scheduled: send another after it.
    pub need_another_keepalive: bool,
}

impl Timers {
    /// The earliest armed deadline.
    pub fn next_deadline(&self) -> Option<Duration> {
        [
            self.retransmit_handshake,
            self.send_keepalive,
            self.new_handshake,
            self.zero_key_material,
            self.persistent_keepalive,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Disarms and reports every timer due at `now`.
    pub fn expired(&mut self, now: Duration) -> Fired {
        let take = |t: &mut Option<Duration>| match *t {
            Some(d) if d <= now => {
                *t = None;
                true
            }
            _ => false,
        };
        Fired {
            retransmit_handshake: take(&mut self.retransmit_handshake),
            send_keepalive: take(&mut self.send_keepalive),
            new_handshake: take(&mut self.new_handshake),
            zero_key_material: take(&mut self.zero_key_material),
            persistent_keepalive: take(&mut self.persistent_keepalive),
        }
    }

    pub fn clear(&mut self) {
        *self = Timers::default();
    }
}

/// Why a handshake initiation left: which of the protocol's rules started it. A
/// gateway that initiates more than its peers' rekeys explain can tell from these
/// whether sessions expired before the peers rekeyed, or data went unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitiationReason {
    /// Data to send and no session at all.
    NoSession,
    /// Data to send and a session that may no longer send: REJECT_AFTER_TIME or
    /// REJECT_AFTER_MESSAGES reached.
    SessionExpired,
    /// Data sent on our own session once it is REKEY_AFTER_TIME old or has sent
    /// REKEY_AFTER_MESSAGES.
    RekeyOnSend,
    /// Data heard on our own session once it is REJECT_AFTER_TIME − KEEPALIVE_TIMEOUT −
    /// REKEY_TIMEOUT old.
    RekeyOnReceive,
    /// Data sent KEEPALIVE_TIMEOUT + REKEY_TIMEOUT ago drew nothing back.
    Unanswered,
    /// The previous initiation drew no response within REKEY_TIMEOUT.
    Retry,
    /// A cookie reply for the initiation in flight: it goes again at once, with mac2.
    CookieReply,
}

impl InitiationReason {
    pub const ALL: [InitiationReason; 7] = [
        InitiationReason::NoSession,
        InitiationReason::SessionExpired,
        InitiationReason::RekeyOnSend,
        InitiationReason::RekeyOnReceive,
        InitiationReason::Unanswered,
        InitiationReason::Retry,
        InitiationReason::CookieReply,
    ];

    /// The reason in snake case, as counters and metric labels name it.
    pub fn name(self) -> &'static str {
        match self {
            InitiationReason::NoSession => "no_session",
            InitiationReason::SessionExpired => "session_expired",
            InitiationReason::RekeyOnSend => "rekey_on_send",
            InitiationReason::RekeyOnReceive => "rekey_on_receive",
            InitiationReason::Unanswered => "unanswered",
            InitiationReason::Retry => "retry",
            InitiationReason::CookieReply => "cookie_reply",
        }
    }
}
