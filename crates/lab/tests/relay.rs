//! The lab's relay counts its own losses apart from the impairment it applies: a
//! datagram its socket cannot send is `send_failed`, not forwarded and not an
//! impairment's drop (as root, in a namespace of its own).

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use wirelane_lab::netns::Netns;
use wirelane_lab::relay::{Impairment, Relay};

#[test]
fn a_datagram_the_relay_cannot_send_is_counted_as_its_own_loss() {
    let ns = Netns::new("lrl").unwrap();
    let at = |s: &str| -> SocketAddr { s.parse().unwrap() };
    // B's side is unroutable in this namespace (only loopback exists): every send
    // towards it fails.
    let relay = Relay::start(
        &ns.name,
        at("127.0.0.1:41000"),
        at("127.0.0.1:41001"),
        at("127.0.0.1:41002"),
        at("192.0.2.1:9"),
        Impairment::default(),
    )
    .unwrap();
    let sender = wirelane_lab::workload::in_ns(&ns.name, || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        for _ in 0..10 {
            s.send_to(b"x", "127.0.0.1:41000")?;
        }
        Ok(())
    });
    wirelane_lab::workload::join(sender).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.a_to_b.snapshot().received < 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    let c = relay.a_to_b.snapshot();
    assert_eq!(
        (c.received, c.forwarded, c.dropped, c.send_failed),
        (10, 0, 0, 10),
        "{c:?}"
    );
}
