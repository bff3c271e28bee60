//! Churn and resource bounds against a real wirelane tunnel (the code `wirelane-lab
//! robust churn` and `robust updown` run; the 10-minute churn run is in ROBUSTNESS.md).

use std::time::Duration;
use wirelane_lab::churn;

#[test]
fn configuration_churn_during_traffic_misroutes_nothing() {
    let o = churn::churn_scenario(Duration::from_secs(20), Duration::from_secs(4))
        .expect("churn scenario");
    churn::print_churn(&o);
    assert_eq!(o.uapi_errors, 0);
    assert!(o.peers_added > 1_000 && o.peers_removed > 0 && o.keys_replaced > 0);
    assert_eq!(o.sink_datagrams, 0, "a packet was routed to a decoy peer");
    assert_eq!(o.tcp_corrupt_bytes, 0);
    assert!(o.samples.iter().all(|s| s.goodput_bps > 0.0));
    assert_eq!(
        o.quiet_after, o.quiet_before,
        "descriptors or threads leaked"
    );
    let first = o.samples.first().expect("samples");
    let last = o.samples.last().expect("samples");
    assert!(
        last.rss_kib < first.rss_kib + 16 * 1024,
        "RSS grew from {} to {} KiB",
        first.rss_kib,
        last.rss_kib
    );
}

#[test]
fn five_hundred_up_down_cycles_leak_nothing() {
    let o = churn::updown_scenario(500).expect("up/down scenario");
    churn::print_updown(&o);
    assert_eq!(o.after, o.before, "descriptors or threads leaked");
    assert!(o.works_after, "the tunnel stopped carrying traffic");
    assert!(o.rss_after_kib < o.rss_before_kib + 4 * 1024);
}
