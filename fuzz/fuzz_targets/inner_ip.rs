//! Inner IP header parsing, as the route stage (TUN side) and the receive side use it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wirelane_dataplane::inner::parse;

fuzz_target!(|data: &[u8]| {
    if let Some(h) = parse(data) {
        // The claimed length never runs past the buffer, and the families agree.
        assert!(h.total_len <= data.len());
        assert_eq!(h.src.is_ipv4(), h.dst.is_ipv4());
        assert!(h.total_len >= if h.src.is_ipv4() { 20 } else { 40 });
    }
});
