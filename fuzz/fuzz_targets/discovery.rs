//! Discovery documents come from the network: every parser must reject garbage without panicking,
//! and whatever parses must survive the merge and the serving table.
#![no_main]
use kube_peer_proxy::discovery::documents as discovery;
use kube_peer_proxy::discovery::merge::merge_groups;
use kube_peer_proxy::snapshot::{ServerDiscovery, ServerRef, Table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = discovery::parse_api_versions(data);
    let _ = discovery::parse_group_list(data);
    let _ = discovery::parse_group(data);
    if let Ok(list) = discovery::parse_resource_list(data) {
        let _ = discovery::version_from_legacy("v1", &list);
    }
    if let Ok(list) = discovery::parse_aggregated(data) {
        let merged = merge_groups(&[&list.items, &list.items]);
        let _ = discovery::to_v2_json(&merged);
        let d = ServerDiscovery { core: Vec::new(), groups: list.items };
        let r = ServerRef { name: "a".into(), cluster: "local".into(), local: true, address: None };
        let t = Table::build(&[(r, &d)]);
        let _ = Table::decode(&t.encode());
    }
    let _ = discovery::is_aggregated_content_type(&String::from_utf8_lossy(data));
});
