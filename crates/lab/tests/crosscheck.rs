//! The lab's TCP figure against iperf3 on the same tunnel (as root). A test binary of
//! its own: cargo runs test binaries one after another, so no other test competes for
//! the two cores while the two tools are compared. Seven interleaved repeats: with five,
//! one clean-clone run saw the medians 19% apart on this noisy 2-core VM (runs of either
//! tool spread 3.1–4.2 Gbit/s).

use std::process::Command;

#[test]
fn tcp_figure_agrees_with_iperf3() {
    let o = Command::new(env!("CARGO_BIN_EXE_wirelane-lab"))
        .args(["crosscheck", "--seconds", "2", "--repeats", "7"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("medians differ by"), "{text}");
}
