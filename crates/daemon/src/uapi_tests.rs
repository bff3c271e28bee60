//! Unit tests of the UAPI's parsing and formatting (`uapi`).

use super::*;

const K1: &str = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
const K2: &str = "c3f41b4c2e5a4ec5a8d91b7e1e0d9f0f1c6b7a8a9d0e1f2a3b4c5d6e7f8a9b0c";

fn set(text: &str) -> Result<DeviceUpdate, UapiError> {
    parse_set(text.lines())
}

#[test]
fn full_request() {
    let up = set(&format!(
        "private_key={K1}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n\
         public_key={K2}\npreshared_key={K1}\nendpoint=[fd00::1]:51820\n\
         persistent_keepalive_interval=25\nreplace_allowed_ips=true\n\
         allowed_ip=10.0.0.1/24\nallowed_ip=-10.9.0.0/16\nprotocol_version=1\n\
         public_key={K1}\nremove=true"
    ))
    .unwrap();
    assert_eq!(up.listen_port, Some(51820));
    assert!(up.replace_peers);
    assert_eq!(up.peers.len(), 2);
    let p = &up.peers[0];
    assert_eq!(p.endpoint, Some("[fd00::1]:51820".parse().unwrap()));
    assert_eq!(p.persistent_keepalive, Some(25));
    assert!(p.replace_allowed_ips);
    assert_eq!(p.allowed_ips[0], ("10.0.0.0/24".parse().unwrap(), true));
    assert_eq!(p.allowed_ips[1], ("10.9.0.0/16".parse().unwrap(), false));
    assert!(up.peers[1].remove);
}

/// A link-local endpoint's scope, by number or by interface name (as `wg showconf`
/// writes it).
#[test]
fn endpoint_scopes_by_number_and_by_name() {
    let scope = |v: &str| match parse_endpoint(v) {
        Ok(SocketAddr::V6(a)) => Ok(a.scope_id()),
        Ok(a) => panic!("{a}"),
        Err(e) => Err(e),
    };
    // SAFETY: a NUL-terminated literal.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    assert_ne!(lo, 0);
    assert_eq!(scope("[fe80::1%lo]:51820"), Ok(lo));
    assert_eq!(scope("[fe80::1%7]:51820"), Ok(7));
    assert_eq!(scope("[fe80::1]:51820"), Ok(0));
    let e = scope("[fe80::1%nosuchif0]:51820").unwrap_err();
    assert!(e.contains("no interface named 'nosuchif0'"), "{e}");
    for bad in [
        "[fe80::1%lo]",
        "fe80::1%lo:1",
        "[10.0.0.1%lo]:1",
        "[fe80::1%lo]:x",
    ] {
        assert!(parse_endpoint(bad).is_err(), "{bad}");
    }
}

#[test]
fn bad_input_names_the_field() {
    let cases = [
        ("listen_port=70000", "listen_port"),
        ("listen_port=+5", "listen_port"),
        ("listen_port=", "listen_port"),
        ("fwmark=-1", "fwmark"),
        ("private_key=abc", "private_key"),
        ("replace_peers=yes", "replace_peers"),
        ("bogus=1", "unknown device key"),
        ("endpoint=1.2.3.4:5", "unknown device key"),
    ];
    for (line, needle) in cases {
        let e = set(line).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        assert!(e.message.contains(needle), "{line}: {}", e.message);
    }
    let e = set("no equals sign").unwrap_err();
    assert_eq!(e.errno, libc::EPROTO, "as wireguard-go answers it");
    assert!(e.message.contains("not key=value"), "{}", e.message);
    let peer_cases = [
        ("endpoint=nothost:1", "endpoint"),
        ("endpoint=1.2.3.4", "endpoint"),
        ("endpoint=1.2.3.4:0", "endpoint"),
        ("allowed_ip=10.0.0.0/33", "allowed_ip"),
        ("allowed_ip=garbage", "allowed_ip"),
        (
            "persistent_keepalive_interval=65536",
            "persistent_keepalive_interval",
        ),
        ("protocol_version=2", "protocol_version"),
        ("preshared_key=zz", "preshared_key"),
        ("remove=false", "remove"),
        ("listen_port=1", "unknown peer key"),
    ];
    for (line, needle) in peer_cases {
        let e = set(&format!("public_key={K2}\n{line}")).unwrap_err();
        assert!(e.message.contains(needle), "{line}: {}", e.message);
    }
}

#[test]
fn get_format() {
    let snap = DeviceSnapshot {
        private_key: Some([1; 32]),
        listen_port: 51820,
        fwmark: 0,
        peers: vec![wirelane_dataplane::PeerSnapshot {
            public_key: [2; 32],
            preshared_key: [0; 32],
            endpoint: Some("[fd00::2]:7".parse().unwrap()),
            last_handshake: Some(Duration::new(1_700_000_000, 5)),
            rx_bytes: 10,
            tx_bytes: 20,
            persistent_keepalive: 0,
            allowed_ips: vec!["10.0.0.0/24".parse().unwrap()],
        }],
    };
    let text = format_get(&snap);
    let expect = format!(
        "private_key={}\nlisten_port=51820\npublic_key={}\npreshared_key={}\nprotocol_version=1\n\
         endpoint=[fd00::2]:7\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\n\
         tx_bytes=20\nrx_bytes=10\npersistent_keepalive_interval=0\nallowed_ip=10.0.0.0/24\n",
        "01".repeat(32),
        "02".repeat(32),
        "00".repeat(32)
    );
    assert_eq!(text, expect);
}
