//! The path grammar, the routing decision and the 404 guard's question must accept any
//! method/path/Accept without panicking, against an empty table and against populated ones whose
//! members are in every state (unknown, stale, unreachable, partly known, membership unknown).
//! Unless the decision without the method and Accept is root discovery, it must be the same with
//! them (the filter reads them only then). The classifier answers as the one it replaced
//! (`tests/reference/request_info_before.rs`).
#![no_main]
use kube_peer_proxy::discovery::documents::{parse_aggregated, GroupDiscovery};
use kube_peer_proxy::request::request_info::RequestKind;
use kube_peer_proxy::request::routing::{decide_with, Decision, LocalReason, RequestFacts};
use kube_peer_proxy::snapshot::{Member, ServerDiscovery, ServerRef, Table};
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/reference/request_info_before.rs"]
mod before;

fn view_new(k: &RequestKind) -> String {
    format!("{k:?}")
}

fn view_old(k: &before::RequestKind) -> String {
    match k {
        before::RequestKind::Resource(r) => format!(
            "Resource(ResourceRequest {{ verb: {:?}, group: {:?}, version: {:?}, namespace: {:?}, resource: {:?}, name: {:?}, subresource: {:?} }})",
            r.verb, r.group, r.version, r.namespace, r.resource, r.name, r.subresource
        ),
        other => format!("{other:?}"),
    }
}

const AGG_133: &[u8] = include_bytes!("../../tests/fixtures/k8s-discovery/aggregated_v2.k8s-1.33.json");
const AGG_137: &[u8] = include_bytes!("../../tests/fixtures/k8s-discovery/aggregated_v2.k8s-1.37-dev-fork.json");

/// Parsed once per thread and kept (documents hold `Rc` strings, so no `static` can hold them).
fn groups() -> &'static (Vec<GroupDiscovery>, Vec<GroupDiscovery>) {
    thread_local! {
        static G: &'static (Vec<GroupDiscovery>, Vec<GroupDiscovery>) = Box::leak(Box::new((
            parse_aggregated(AGG_133).map(|l| l.items).unwrap_or_default(),
            parse_aggregated(AGG_137).map(|l| l.items).unwrap_or_default(),
        )));
    }
    G.with(|g| *g)
}

/// Three members (local old, two new); each state bit comes from `bits`.
fn table(bits: u32) -> Table {
    let (old, new) = groups();
    let unknown = vec![("batch".to_string(), "v1".to_string())];
    let members: Vec<Member> = (0..3u32)
        .map(|i| {
            let b = bits >> (i * 6);
            let docs: &[GroupDiscovery] = if i == 0 { old } else { new };
            Member {
                server: ServerRef {
                    name: format!("s{i}"),
                    cluster: format!("c{i}"),
                    local: i == 0,
                    address: (b & 32 != 0).then(|| format!("127.0.0.{}:6443", 10 + i)),
                },
                core: (b & 1 != 0).then_some(docs),
                groups: (b & 2 != 0).then_some(docs),
                unknown_versions: if b & 4 != 0 { &unknown } else { &[] },
                fresh_core: b & 8 != 0,
                fresh_groups: b & 8 != 0,
                reachable: b & 16 != 0,
            }
        })
        .collect();
    let mut t = Table::build_members(&members);
    t.membership_unknown = bits & (1 << 20) != 0;
    t
}

fuzz_target!(|data: &[u8]| {
    let (state, data) = match data {
        [a, b, c, rest @ ..] => (u32::from_le_bytes([*a, *b, *c, 0]), rest),
        _ => (0, data),
    };
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let method = parts.next().unwrap_or("GET");
    let path = parts.next().unwrap_or("");
    let accept = parts.next();
    let _ = kube_peer_proxy::request::request_info::parse(method, path);
    // The allocation-free classifier answers as the one it replaced did.
    let (mut a, mut b) = (String::new(), String::new());
    let new = kube_peer_proxy::request::request_info::parse_decoded(method, path, &mut a);
    let old = before::parse_decoded(method, path, &mut b);
    assert_eq!(view_new(&new), view_old(&old), "{method} {path}");
    let _ = kube_peer_proxy::request::accept::negotiate(accept);
    let local = ServerRef { name: "a".into(), cluster: "local".into(), local: true, address: None };
    let empty = ServerDiscovery::default();
    let facts = RequestFacts { method, path, accept, peer_proxied: None };
    for t in [Table::build(&[(local, &empty)]), table(state)] {
        let d = decide_with(&facts, Some(&t), true, &mut |n| n / 2, &mut |i| state & (1 << (21 + i % 3)) != 0);
        let _ = kube_peer_proxy::request::guard::question(method, path, Some(&t));
        // The filter reads the method and Accept only when the decision without them is root
        // discovery: elsewhere they must not matter.
        let blind = RequestFacts { method: "", accept: None, ..facts.clone() };
        let d2 = decide_with(&blind, Some(&t), true, &mut |n| n / 2, &mut |i| state & (1 << (21 + i % 3)) != 0);
        if d2 != Decision::Local(LocalReason::LocalDiscovery) {
            assert_eq!(d, d2, "the method or Accept changed the decision for {path:?}");
        }
    }
    let _ = decide_with(&facts, None, true, &mut |_| 0, &mut |_| false);
    let _ = kube_peer_proxy::request::guard::question(method, path, None);
});
