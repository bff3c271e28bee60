//! The lab's matrix configuration file (TOML): a clear error or a matrix, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wirelane_lab::matrix::Matrix;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = Matrix::parse(text) {
        // An accepted matrix can be scheduled and every cell named.
        for run in m.schedule().iter().take(64) {
            let _ = m.cells[run.cell].id();
        }
    }
});
