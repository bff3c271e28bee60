//! The emulated peer on a simulated clock, against a gateway built from `proto`.

use super::*;

fn gateway() -> LocalIdentity {
    let mut gw_private = [0u8; 32];
    OsRng.fill_bytes(&mut gw_private);
    LocalIdentity::new(gw_private)
}

/// The gateway's side of one handshake, built from `proto`: its response to
/// `init` (macs stamped) and its session.
fn respond(gateway: &LocalIdentity, peer: &EmulatedPeer, init: &[u8]) -> (Vec<u8>, Keypair) {
    let mut responder = Handshake::new(peer.public(), [0; 32]);
    let phase1 = consume_initiation_phase1(gateway, &Initiation::parse(init).unwrap()).unwrap();
    let (resp, keys, _) = responder
        .consume_initiation_and_respond(gateway, phase1, 99, Duration::ZERO, &mut OsRng)
        .unwrap();
    let mut resp = resp.to_bytes().to_vec();
    CookieGenerator::new(&peer.public()).stamp(&mut resp, Duration::ZERO);
    (resp, Keypair::new(&keys, Duration::ZERO))
}

/// A transport message of 32 bytes of `fill`, sealed by the gateway's `session`.
fn from_gateway(session: &Keypair, counter: u64, fill: u8) -> Vec<u8> {
    let mut msg = vec![0u8; EmulatedPeer::sealed_len(32)];
    msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + 32].fill(fill);
    session.seal(counter, &mut msg);
    msg
}

/// An initiation from `from` to `peer`, macs stamped as the daemon stamps them,
/// with the initiator's handshake state (to take the peer's response).
fn initiation_to(peer: &EmulatedPeer, from: &LocalIdentity, wall: u64) -> (Handshake, Vec<u8>) {
    let mut initiator = Handshake::new(peer.public(), [0; 32]);
    let (init, _) = initiator
        .create_initiation(from, 80, Duration::from_secs(wall), &mut OsRng)
        .unwrap();
    let mut init = init.to_bytes().to_vec();
    CookieGenerator::new(&peer.public()).stamp(&mut init, Duration::ZERO);
    (initiator, init)
}

/// A responder built from `proto` answers the emulated peer's initiation: the two
/// sessions then seal and open each other's messages.
#[test]
fn completes_a_handshake_and_seals_for_the_responder() {
    let gateway = gateway();
    let mut peer = EmulatedPeer::new(7, &gateway.public);
    let now = Instant::now();
    let init = peer.initiation(now, Duration::from_secs(1), Duration::from_secs(1_000));
    assert_eq!(init.len(), wirelane_proto::messages::INITIATION_LEN);

    let (resp, theirs) = respond(&gateway, &peer, &init);
    assert_eq!(
        peer.hear(&resp, now, Duration::from_secs(1)),
        Heard::Established
    );

    let mut msg = vec![0u8; EmulatedPeer::sealed_len(32)];
    msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + 32].fill(0xab);
    peer.seal(5, &mut msg);
    assert_eq!(theirs.open(5, &mut msg), Ok(32));
    assert!(msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + 32]
        .iter()
        .all(|&b| b == 0xab));
}

/// On a simulated clock: the session rekeys once it is REKEY_ON_RECEIVE old, the
/// new one has its own sender index, and messages the gateway sealed with the old
/// one before it switched still open.
#[test]
fn rekeys_as_a_receiving_initiator_and_keeps_the_previous_session() {
    let gateway = gateway();
    let mut peer = EmulatedPeer::new(3, &gateway.public);
    let t0 = Instant::now();
    let init = peer.initiation(t0, Duration::ZERO, Duration::from_secs(1_000));
    assert!(!peer.retry_due(t0));
    assert!(peer.retry_due(t0 + REKEY_TIMEOUT));
    let (resp, first) = respond(&gateway, &peer, &init);
    assert_eq!(peer.hear(&resp, t0, Duration::ZERO), Heard::Established);
    assert!(!peer.retry_due(t0 + REKEY_TIMEOUT));
    assert!(!peer.rekey_due(
        t0 + REKEY_ON_RECEIVE - Duration::from_millis(1),
        REKEY_ON_RECEIVE
    ));
    let t1 = t0 + REKEY_ON_RECEIVE;
    assert!(peer.rekey_due(t1, REKEY_ON_RECEIVE));
    // A second response to the first initiation is no longer awaited.
    assert_eq!(peer.hear(&resp, t1, Duration::ZERO), Heard::Ignored);

    let init = peer.initiation(t1, Duration::ZERO, Duration::from_secs(1_165));
    assert!(
        !peer.rekey_due(t1, REKEY_ON_RECEIVE),
        "one initiation per event"
    );
    // Until the response, the first session is the current one.
    let mut old = from_gateway(&first, 1, 0x11);
    assert!(matches!(
        peer.hear(&old, t1, Duration::ZERO),
        Heard::Transport {
            counter: 1,
            session: Session::Current
        }
    ));
    let (resp, second) = respond(&gateway, &peer, &init);
    assert_ne!(first.remote_index, second.remote_index);
    assert_eq!(peer.hear(&resp, t1, Duration::ZERO), Heard::Established);
    assert_eq!(peer.sessions, 2);
    assert!(!peer.rekey_due(t1 + Duration::from_secs(1), REKEY_ON_RECEIVE));

    let mut new = from_gateway(&second, 0, 0x22);
    assert_eq!(
        peer.hear(&new, t1, Duration::ZERO),
        Heard::Transport {
            counter: 0,
            session: Session::Current
        }
    );
    assert_eq!(
        peer.hear(&old, t1, Duration::ZERO),
        Heard::Transport {
            counter: 1,
            session: Session::Previous
        }
    );
    assert_eq!(peer.open(Session::Previous, 1, &mut old), Some(32));
    assert_eq!(old[TRANSPORT_HEADER_LEN], 0x11);
    assert_eq!(peer.open(Session::Current, 0, &mut new), Some(32));
    assert_eq!(new[TRANSPORT_HEADER_LEN], 0x22);
    // What we seal now, the gateway opens with the new session only.
    let mut ours = vec![0u8; EmulatedPeer::sealed_len(16)];
    peer.seal(4, &mut ours);
    assert_eq!(second.open(4, &mut ours.clone()), Ok(16));
    assert!(first.open(4, &mut ours).is_err());
}

/// The gateway initiates (its data went unanswered): the peer answers, keeps its
/// session current until the gateway's first message on the new one, then takes
/// the new one and still opens what the old one carried.
#[test]
fn answers_the_gateways_initiation_and_takes_its_session_at_the_first_message() {
    let gateway = gateway();
    let mut peer = EmulatedPeer::new(5, &gateway.public);
    let t0 = Instant::now();
    let init = peer.initiation(t0, Duration::ZERO, Duration::from_secs(1_000));
    let (resp, first) = respond(&gateway, &peer, &init);
    assert_eq!(peer.hear(&resp, t0, Duration::ZERO), Heard::Established);

    // The gateway's initiation, built from `proto` as the daemon builds it.
    let (mut initiator, init) = initiation_to(&peer, &gateway, 2_000);
    let Heard::Answer(answer) = peer.hear(&init, t0, Duration::ZERO) else {
        panic!("no answer to the gateway's initiation");
    };
    assert_eq!(peer.responses, 1);
    let keys = initiator
        .consume_response(&gateway, &Response::parse(&answer).unwrap())
        .unwrap();
    let second = Keypair::new(&keys, Duration::ZERO);
    assert_ne!(second.remote_index, first.remote_index);

    // Until the gateway uses the new session, the first one is current.
    let mut old = from_gateway(&first, 3, 0x33);
    assert_eq!(
        peer.hear(&old, t0, Duration::ZERO),
        Heard::Transport {
            counter: 3,
            session: Session::Current
        }
    );
    let mut new = from_gateway(&second, 0, 0x44);
    assert_eq!(
        peer.hear(&new, t0, Duration::ZERO),
        Heard::Confirmed { counter: 0 }
    );
    assert_eq!(peer.sessions, 2);
    assert_eq!(peer.open(Session::Current, 0, &mut new), Some(32));
    assert_eq!(new[TRANSPORT_HEADER_LEN], 0x44);
    assert_eq!(
        peer.hear(&old, t0, Duration::ZERO),
        Heard::Transport {
            counter: 3,
            session: Session::Previous
        }
    );
    assert_eq!(peer.open(Session::Previous, 3, &mut old), Some(32));
    // An initiation not from the gateway's key is ignored.
    let stranger = LocalIdentity::new([7; 32]);
    let (_, init) = initiation_to(&peer, &stranger, 3_000);
    assert_eq!(peer.hear(&init, t0, Duration::ZERO), Heard::Ignored);
}

/// A gateway under load answers a response without mac2 with a cookie reply: the
/// peer keeps the cookie, so its response to the gateway's retry carries mac2.
#[test]
fn a_cookie_reply_to_its_response_puts_mac2_on_the_next() {
    use wirelane_proto::cookie::{CookieChecker, MacVerdict};
    let gateway = gateway();
    let mut peer = EmulatedPeer::new(9, &gateway.public);
    let t0 = Instant::now();
    let mut checker = CookieChecker::new(&gateway.public);
    let src: std::net::SocketAddr = "10.9.0.9:40009".parse().unwrap();
    let answer_to = |wall: u64, peer: &mut EmulatedPeer| {
        let (_, init) = initiation_to(peer, &gateway, wall);
        // The gateway retries 5 s later: past the initiation flood limit.
        let since = Duration::from_secs(wall - 1_000);
        match peer.hear(&init, t0, since) {
            Heard::Answer(answer) => answer,
            other => panic!("{other:?}"),
        }
    };
    let first = answer_to(1_000, &mut peer);
    let verdict = checker.verify(&first, &src, Duration::ZERO, &mut OsRng);
    assert_eq!(verdict, MacVerdict::Mac1Only);
    let receiver = Response::parse(&first).unwrap().sender;
    let reply = checker.create_reply(&first, receiver, &src, Duration::ZERO, &mut OsRng);
    let reply = reply.to_bytes();
    assert_eq!(peer.hear(&reply, t0, Duration::ZERO), Heard::Ignored);
    assert_eq!(peer.cookie_replies, 1);
    let second = answer_to(1_005, &mut peer);
    let verdict = checker.verify(&second, &src, Duration::ZERO, &mut OsRng);
    assert_eq!(verdict, MacVerdict::Mac2Valid);
}
