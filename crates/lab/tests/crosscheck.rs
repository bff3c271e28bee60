//! The lab's TCP meter against an independent meter of the same transfer: the
//! receiving tunnel interface's kernel byte counter (as root). Both count one transfer,
//! so they agree whatever the machine's load; what separates them is the TCP/IP
//! headers the kernel counts and the lab does not, and any retransmission.

#[test]
fn the_lab_meter_agrees_with_the_interface_counter() {
    for which in ["wirelane", "wireguard-go"] {
        let m = wirelane_lab::crosscheck::meter(which.parse().unwrap(), 2.0).unwrap();
        assert!(m.lab_bytes > 0, "{which}: nothing moved: {m:?}");
        // Never more than the interface delivered; less by the headers (3.8% for
        // full segments at MTU 1420, next to nothing when segments are coalesced) and
        // by retransmissions, each at most one MTU.
        assert!(m.lab_bytes <= m.interface_bytes, "{which}: {m:?}");
        let first_copies = m
            .interface_bytes
            .saturating_sub(m.retransmits * 1420)
            .max(1);
        assert!(
            m.lab_bytes as f64 >= 0.95 * first_copies as f64,
            "{which}: the lab read {} bytes of {} the interface took ({} retransmits)",
            m.lab_bytes,
            m.interface_bytes,
            m.retransmits
        );
    }
}
