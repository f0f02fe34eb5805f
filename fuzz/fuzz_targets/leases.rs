//! Lease lists come from the network: the parsers must reject garbage without panicking, and what
//! they accept must be canonical (an accepted address parses to itself).
#![no_main]
use kube_peer_proxy::discovery::leases::{diff, parse_address, parse_lease_list, parse_lease_list_at, parse_rfc3339_ms, peer_address, Own};
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
    // With a peer port, an annotation's address keeps its host and takes that port; anything else
    // (a hosts entry, used as written) is still canonical.
    if let Ok(peers) = parse_lease_list_at(data, &own, &hosts, Some(6444)) {
        for p in &peers {
            if let Some(a) = &p.address {
                assert_eq!(parse_address(a).as_deref(), Some(a.as_str()));
                assert!(a.ends_with(":6444") || a == "10.0.0.3:6443", "{a}");
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    if let Some(a) = peer_address(&text, Some(6444)) {
        assert!(a.ends_with(":6444"));
        assert_eq!(parse_address(&a).as_deref(), Some(a.as_str()));
        let advertised = parse_address(&text).unwrap_or_default();
        assert_eq!(a.rsplit_once(':').map(|x| x.0), advertised.rsplit_once(':').map(|x| x.0));
    } else {
        assert_eq!(parse_address(&text), None);
    }
    let _ = parse_rfc3339_ms(&text);
    if let Some(a) = parse_address(&text) {
        assert_eq!(parse_address(&a).as_deref(), Some(a.as_str()));
    }
});
