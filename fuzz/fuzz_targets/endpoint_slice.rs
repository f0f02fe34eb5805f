//! The EndpointSlice `default/kubernetes` comes from the network (and from whoever may write it):
//! the parser must reject garbage without panicking, and every member it accepts must be a
//! canonical IP, never the local server, with a canonical address at the port it was given.
#![no_main]
use std::net::IpAddr;

use kube_peer_proxy::discovery::endpoints::parse_endpoint_slice;
use kube_peer_proxy::discovery::leases::parse_address;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let own: IpAddr = IpAddr::from([10, 0, 0, 1]);
    for (own, peer_port) in [(Some(own), None), (None, Some(6444))] {
        let Ok(peers) = parse_endpoint_slice(data, own, peer_port) else { continue };
        let mut last: Option<&str> = None;
        for p in &peers {
            let ip: IpAddr = p.id.parse().expect("the id is an IP");
            assert_eq!(ip.to_string(), p.id, "canonical");
            assert_ne!(Some(ip), own, "never the local server");
            assert!(p.holder.is_empty() && p.hostname.is_empty() && p.expires_ms.is_none());
            assert!(last < Some(p.id.as_str()), "sorted, one per IP");
            last = Some(p.id.as_str());
            if let Some(a) = &p.address {
                assert_eq!(parse_address(a).as_deref(), Some(a.as_str()));
                let (host, port) = a.rsplit_once(':').expect("ip:port");
                assert_eq!(host.trim_start_matches('[').trim_end_matches(']'), p.id);
                if let Some(want) = peer_port {
                    assert_eq!(port, want.to_string());
                }
            }
        }
    }
});
