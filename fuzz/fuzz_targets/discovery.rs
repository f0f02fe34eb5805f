//! Discovery documents come from the network: every parser must reject garbage without panicking,
//! and whatever parses must survive the merge and the serving table.
#![no_main]
use kube_peer_proxy::discovery::documents as discovery;
use kube_peer_proxy::discovery::merge::merge_groups;
use kube_peer_proxy::discovery::sync::Body;
use kube_peer_proxy::snapshot::{ServerDiscovery, ServerRef, Table};
use libfuzzer_sys::fuzz_target;
use std::rc::Rc;

fuzz_target!(|data: &[u8]| {
    let _ = discovery::parse_api_versions(data);
    let _ = discovery::parse_group_list(data);
    let _ = discovery::parse_group(data);
    if let Ok(list) = discovery::parse_resource_list(data) {
        let _ = discovery::version_from_legacy("v1", &list);
    }
    // The discovery service parses aggregated documents read in pieces from Envoy's buffer: that
    // must accept and reject exactly what the parse of the bytes in memory does.
    let whole = discovery::parse_aggregated(data);
    let bytes = Rc::new(data.to_vec());
    let read = Rc::clone(&bytes);
    let pieces = Body::Pieces {
        len: bytes.len(),
        read: Rc::new(move |start, max| read.get(start..(start + max.min(7)).min(read.len())).map(<[u8]>::to_vec)),
    };
    let streamed = discovery::parse_aggregated_from(pieces.reader());
    match (&whole, &streamed) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => panic!("in pieces {:?}, in memory {:?}", streamed.is_ok(), whole.is_ok()),
    }
    if let Ok(list) = whole {
        let merged = merge_groups(&[&list.items, &list.items]);
        let _ = discovery::to_v2_json(&merged);
        let d = ServerDiscovery { core: Vec::new(), groups: list.items };
        let r = ServerRef { name: "a".into(), cluster: "local".into(), local: true, address: None };
        let t = Table::build(&[(r, &d)]);
        let _ = Table::decode(&t.encode());
    }
    let _ = discovery::is_aggregated_content_type(&String::from_utf8_lossy(data));
});
