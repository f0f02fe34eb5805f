//! The path grammar and the routing decision must accept any method/path/Accept without panicking.
#![no_main]
use kube_peer_proxy::routing::{decide, RequestFacts};
use kube_peer_proxy::snapshot::{ServerDiscovery, ServerRef, Table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let method = parts.next().unwrap_or("GET");
    let path = parts.next().unwrap_or("");
    let accept = parts.next();
    let _ = kube_peer_proxy::request_info::parse(method, path);
    let _ = kube_peer_proxy::accept::negotiate(accept);
    let local = ServerRef { name: "a".into(), cluster: "local".into(), local: true, address: None };
    let empty = ServerDiscovery::default();
    let table = Table::build(&[(local, &empty)]);
    let facts = RequestFacts { method, path, accept, peer_proxied: None };
    let _ = decide(&facts, Some(&table), true, &mut |n| n / 2);
    let _ = decide(&facts, None, true, &mut |_| 0);
});
