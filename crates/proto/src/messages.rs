//! Wire formats of the four WireGuard messages (whitepaper §5.4): handshake initiation,
//! handshake response, cookie reply and transport data. Parsing checks lengths and the
//! type byte only; authentication is the handshake's and the keypair's job.

use crate::crypto::{MAC_LEN, TAG_LEN, XNONCE_LEN};

pub const TYPE_INITIATION: u8 = 1;
pub const TYPE_RESPONSE: u8 = 2;
pub const TYPE_COOKIE_REPLY: u8 = 3;
pub const TYPE_TRANSPORT: u8 = 4;

pub const INITIATION_LEN: usize = 148;
pub const RESPONSE_LEN: usize = 92;
pub const COOKIE_REPLY_LEN: usize = 64;
/// Header of a transport data message: type, receiver index, counter.
pub const TRANSPORT_HEADER_LEN: usize = 16;
/// A keepalive is a transport message with an empty (encrypted) payload.
pub const TRANSPORT_MIN_LEN: usize = TRANSPORT_HEADER_LEN + TAG_LEN;

/// Offsets of mac1 and mac2 inside handshake messages: they cover everything before them.
pub const INITIATION_MAC1_OFFSET: usize = INITIATION_LEN - 2 * MAC_LEN;
pub const RESPONSE_MAC1_OFFSET: usize = RESPONSE_LEN - 2 * MAC_LEN;

/// The message kinds a datagram can carry, classified by type byte and exact length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Initiation,
    Response,
    CookieReply,
    Transport,
}

/// Why a datagram was not a WireGuard message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("datagram of {0} bytes is too short for any WireGuard message")]
    TooShort(usize),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("message type {kind:?} has wrong length {len}")]
    BadLength { kind: Kind, len: usize },
    #[error("reserved header bytes are not zero")]
    Reserved,
}

/// Classifies a datagram without copying it.
pub fn classify(buf: &[u8]) -> Result<Kind, ParseError> {
    if buf.len() < 4 {
        return Err(ParseError::TooShort(buf.len()));
    }
    if buf[1..4] != [0, 0, 0] {
        return Err(ParseError::Reserved);
    }
    let (kind, ok) = match buf[0] {
        TYPE_INITIATION => (Kind::Initiation, buf.len() == INITIATION_LEN),
        TYPE_RESPONSE => (Kind::Response, buf.len() == RESPONSE_LEN),
        TYPE_COOKIE_REPLY => (Kind::CookieReply, buf.len() == COOKIE_REPLY_LEN),
        TYPE_TRANSPORT => (Kind::Transport, buf.len() >= TRANSPORT_MIN_LEN),
        t => return Err(ParseError::UnknownType(t)),
    };
    if ok {
        Ok(kind)
    } else {
        Err(ParseError::BadLength {
            kind,
            len: buf.len(),
        })
    }
}

/// The sender index of an initiation or a response, which both carry it at bytes 4..8,
/// without parsing the rest. `None` for any other buffer.
pub fn handshake_sender(buf: &[u8]) -> Option<u32> {
    match classify(buf) {
        Ok(Kind::Initiation | Kind::Response) => Some(le32(&buf[4..])),
        _ => None,
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    b[..N].try_into().expect("length checked by classify")
}

/// Handshake initiation, type 1.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Initiation {
    pub sender: u32,
    pub ephemeral: [u8; 32],
    pub encrypted_static: [u8; 32 + TAG_LEN],
    pub encrypted_timestamp: [u8; 12 + TAG_LEN],
    pub mac1: [u8; MAC_LEN],
    pub mac2: [u8; MAC_LEN],
}

impl Initiation {
    /// Parses a buffer that [`classify`] said is an initiation.
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        expect(b, Kind::Initiation)?;
        Ok(Initiation {
            sender: le32(&b[4..]),
            ephemeral: arr(&b[8..]),
            encrypted_static: arr(&b[40..]),
            encrypted_timestamp: arr(&b[88..]),
            mac1: arr(&b[116..]),
            mac2: arr(&b[132..]),
        })
    }

    pub fn to_bytes(&self) -> [u8; INITIATION_LEN] {
        let mut b = [0u8; INITIATION_LEN];
        b[0] = TYPE_INITIATION;
        b[4..8].copy_from_slice(&self.sender.to_le_bytes());
        b[8..40].copy_from_slice(&self.ephemeral);
        b[40..88].copy_from_slice(&self.encrypted_static);
        b[88..116].copy_from_slice(&self.encrypted_timestamp);
        b[116..132].copy_from_slice(&self.mac1);
        b[132..148].copy_from_slice(&self.mac2);
        b
    }
}

/// Handshake response, type 2.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Response {
    pub sender: u32,
    pub receiver: u32,
    pub ephemeral: [u8; 32],
    pub encrypted_nothing: [u8; TAG_LEN],
    pub mac1: [u8; MAC_LEN],
    pub mac2: [u8; MAC_LEN],
}

impl Response {
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        expect(b, Kind::Response)?;
        Ok(Response {
            sender: le32(&b[4..]),
            receiver: le32(&b[8..]),
            ephemeral: arr(&b[12..]),
            encrypted_nothing: arr(&b[44..]),
            mac1: arr(&b[60..]),
            mac2: arr(&b[76..]),
        })
    }

    pub fn to_bytes(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0] = TYPE_RESPONSE;
        b[4..8].copy_from_slice(&self.sender.to_le_bytes());
        b[8..12].copy_from_slice(&self.receiver.to_le_bytes());
        b[12..44].copy_from_slice(&self.ephemeral);
        b[44..60].copy_from_slice(&self.encrypted_nothing);
        b[60..76].copy_from_slice(&self.mac1);
        b[76..92].copy_from_slice(&self.mac2);
        b
    }
}

/// Cookie reply, type 3.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CookieReply {
    pub receiver: u32,
    pub nonce: [u8; XNONCE_LEN],
    pub encrypted_cookie: [u8; MAC_LEN + TAG_LEN],
}

impl CookieReply {
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        expect(b, Kind::CookieReply)?;
        Ok(CookieReply {
            receiver: le32(&b[4..]),
            nonce: arr(&b[8..]),
            encrypted_cookie: arr(&b[32..]),
        })
    }

    pub fn to_bytes(&self) -> [u8; COOKIE_REPLY_LEN] {
        let mut b = [0u8; COOKIE_REPLY_LEN];
        b[0] = TYPE_COOKIE_REPLY;
        b[4..8].copy_from_slice(&self.receiver.to_le_bytes());
        b[8..32].copy_from_slice(&self.nonce);
        b[32..64].copy_from_slice(&self.encrypted_cookie);
        b
    }
}

/// Header of a transport data message, type 4; the payload follows in place.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TransportHeader {
    pub receiver: u32,
    pub counter: u64,
}

impl TransportHeader {
    pub fn parse(b: &[u8]) -> Result<Self, ParseError> {
        expect(b, Kind::Transport)?;
        Ok(TransportHeader {
            receiver: le32(&b[4..]),
            counter: u64::from_le_bytes(arr(&b[8..])),
        })
    }

    pub fn write(&self, b: &mut [u8]) {
        b[..4].copy_from_slice(&[TYPE_TRANSPORT, 0, 0, 0]);
        b[4..8].copy_from_slice(&self.receiver.to_le_bytes());
        b[8..16].copy_from_slice(&self.counter.to_le_bytes());
    }
}

fn expect(b: &[u8], kind: Kind) -> Result<(), ParseError> {
    let got = classify(b)?;
    if got == kind {
        Ok(())
    } else {
        Err(ParseError::BadLength { kind, len: b.len() })
    }
}

/// Length of a transport payload padded to a multiple of 16 bytes (whitepaper §5.4.6),
/// but never padded beyond the tunnel MTU (a full-MTU packet is sent as it is), as the
/// kernel pads (`calculate_skb_padding`): a packet longer than the MTU (a route's own
/// MTU below the device's) has the remainder past its last whole MTU padded, so its
/// length is hidden as well; an MTU of 0 (unknown) pads to 16 without a bound.
pub fn padded_len(len: usize, mtu: usize) -> usize {
    let align = |n: usize| (n + 15) & !15;
    if mtu == 0 {
        return align(len);
    }
    let last_unit = if len > mtu { len % mtu } else { len };
    len - last_unit + mtu.min(align(last_unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_rejects_bad_lengths_and_types() {
        assert_eq!(classify(&[1, 0, 0]), Err(ParseError::TooShort(3)));
        assert_eq!(classify(&[9, 0, 0, 0]), Err(ParseError::UnknownType(9)));
        assert_eq!(classify(&[1, 0, 1, 0]), Err(ParseError::Reserved));
        assert!(classify(&[1u8; 147]).is_err());
        let mut init = [0u8; INITIATION_LEN];
        init[0] = 1;
        assert_eq!(classify(&init), Ok(Kind::Initiation));
        let mut t = [0u8; TRANSPORT_MIN_LEN - 1];
        t[0] = 4;
        assert!(classify(&t).is_err());
    }

    #[test]
    fn roundtrips() {
        let i = Initiation {
            sender: 0xdeadbeef,
            ephemeral: [1; 32],
            encrypted_static: [2; 48],
            encrypted_timestamp: [3; 28],
            mac1: [4; 16],
            mac2: [5; 16],
        };
        assert_eq!(Initiation::parse(&i.to_bytes()).unwrap(), i);
        let r = Response {
            sender: 1,
            receiver: 2,
            ephemeral: [6; 32],
            encrypted_nothing: [7; 16],
            mac1: [8; 16],
            mac2: [9; 16],
        };
        assert_eq!(Response::parse(&r.to_bytes()).unwrap(), r);
        assert_eq!(handshake_sender(&i.to_bytes()), Some(0xdeadbeef));
        assert_eq!(handshake_sender(&r.to_bytes()), Some(1));
        let c = CookieReply {
            receiver: 3,
            nonce: [1; 24],
            encrypted_cookie: [2; 32],
        };
        assert_eq!(CookieReply::parse(&c.to_bytes()).unwrap(), c);
        assert_eq!(handshake_sender(&c.to_bytes()), None);
        assert_eq!(handshake_sender(&[1, 0, 0]), None);
    }

    #[test]
    fn padding() {
        assert_eq!(padded_len(0, 1420), 0);
        assert_eq!(padded_len(1, 1420), 16);
        assert_eq!(padded_len(16, 1420), 16);
        assert_eq!(padded_len(1419, 1420), 1420);
        assert_eq!(padded_len(1420, 1420), 1420);
        assert_eq!(padded_len(1413, 1420), 1420);
        // Past the MTU (a route's own MTU below the packet), and with none known, as
        // the kernel's calculate_skb_padding.
        assert_eq!(padded_len(1400, 1280), 1408);
        assert_eq!(padded_len(2560, 1280), 2560);
        assert_eq!(padded_len(2561, 1280), 2576);
        assert_eq!(padded_len(5, 0), 16);
        assert_eq!(padded_len(0, 0), 0);
    }
}
