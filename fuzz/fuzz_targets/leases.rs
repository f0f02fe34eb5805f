//! Lease lists come from the network: the parsers must reject garbage without panicking, and what
//! they accept must be canonical (an accepted address parses to itself).
#![no_main]
use kube_peer_proxy::leases::{diff, parse_address, parse_lease_list, parse_rfc3339_ms, Own};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let own = Own {
        hostname: Some("cp-a".into()),
        address: Some("10.0.0.1:6443".into()),
    };
    let hosts = [("cp-c".to_string(), "10.0.0.3:6443".to_string())];
    if let Ok(peers) = parse_lease_list(data, &own, &hosts) {
        for p in &peers {
            assert!(!p.id.is_empty() && !p.holder.is_empty());
            if let Some(a) = &p.address {
                assert_eq!(parse_address(a).as_deref(), Some(a.as_str()));
            }
            let _ = p.is_live(0);
            let _ = p.is_live(u64::MAX);
        }
        let _ = diff(&peers, &[]);
        let _ = diff(&[], &peers);
    }
    let text = String::from_utf8_lossy(data);
    let _ = parse_rfc3339_ms(&text);
    if let Some(a) = parse_address(&text) {
        assert_eq!(parse_address(&a).as_deref(), Some(a.as_str()));
    }
});
