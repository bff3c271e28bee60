//! The UAPI `set` parser: any bytes, split into lines as the socket server splits them.
//! It must answer with an error or a complete update, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wirelane_daemon::uapi::parse_set;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(update) = parse_set(text.lines()) {
        // An accepted update names each peer by a 32-byte key; nothing else is checked
        // here because apply() validates against the device.
        let _ = update.peers.len();
    }
});
