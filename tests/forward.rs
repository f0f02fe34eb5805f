//! The request-phase header decisions (src/request/forward.rs), the filter's local replies
//! (src/request/reply.rs `LocalReply`), a merged answer's header edits (src/request/response.rs)
//! and the client certificate's assertion (src/request/identity.rs `assertion`): what the adapter
//! writes, decided natively.
#![cfg(test)]

use kube_peer_proxy::config::{Config, LeaseDiscovery, Peer};
use kube_peer_proxy::request::forward::{
    routing_headers, to_peer, ToPeer, MERGED_REQUEST_DROPS, MERGED_REQUEST_DROPS_ENCODING,
};
use kube_peer_proxy::request::identity::RequestHeaderNames;
use kube_peer_proxy::request::reply::{
    guarded_not_found, peer_unavailable, unauthorized, LocalReply, ProxyError, FILTER_REPLY_HEADER,
};
use kube_peer_proxy::request::response::merged_headers;
use kube_peer_proxy::request::routing::{Gvr, MergedDoc};
use kube_peer_proxy::snapshot::{ServerRef, Table};

fn config(lease: bool) -> Config {
    Config {
        local_cluster: "local".into(),
        peers: vec![Peer {
            name: "b".into(),
            cluster: "peer-b".into(),
        }],
        lease_discovery: lease.then(|| LeaseDiscovery {
            source: Default::default(),
            cluster: "leased".into(),
            address_header: "x-kpp-address".into(),
            local_hostname: Some("a".into()),
            local_address: None,
            hosts: Vec::new(),
            peer_port: None,
        }),
        ..Config::default()
    }
}

fn server(cluster: &str, address: Option<&str>) -> ServerRef {
    ServerRef {
        name: "b".into(),
        cluster: cluster.into(),
        local: false,
        address: address.map(str::to_string),
    }
}

fn gvr() -> Gvr<'static> {
    Gvr {
        group: "apps".into(),
        version: "v1".into(),
        resource: "deployments".into(),
    }
}

#[test]
fn only_the_filter_may_set_the_routing_headers() {
    assert_eq!(
        routing_headers(&config(false)).collect::<Vec<_>>(),
        ["x-kube-peer-proxy-cluster"]
    );
    assert_eq!(
        routing_headers(&config(true)).collect::<Vec<_>>(),
        ["x-kube-peer-proxy-cluster", "x-kpp-address"]
    );
    assert_eq!(MERGED_REQUEST_DROPS, "if-none-match");
    assert_eq!(MERGED_REQUEST_DROPS_ENCODING, "accept-encoding");
}

#[test]
fn a_reroute_sets_address_cluster_and_peer_proxied_in_that_order() {
    let c = config(false);
    let s = server("peer-b", None);
    assert_eq!(
        to_peer(&c, &s),
        ToPeer::Headers(vec![
            ("x-kube-peer-proxy-cluster", "peer-b"),
            ("x-kubernetes-peer-proxied", "true")
        ])
    );
    let c = config(true);
    let s = server("leased", Some("10.0.0.2:6443"));
    assert_eq!(
        to_peer(&c, &s),
        ToPeer::Headers(vec![
            ("x-kpp-address", "10.0.0.2:6443"),
            ("x-kube-peer-proxy-cluster", "leased"),
            ("x-kubernetes-peer-proxied", "true")
        ])
    );
}

#[test]
fn a_reroute_never_names_an_unknown_cluster_nor_an_address_without_lease_mode() {
    let c = config(false);
    assert_eq!(to_peer(&c, &server("elsewhere", None)), ToPeer::UnknownCluster);
    assert_eq!(
        to_peer(&c, &server("peer-b", Some("10.0.0.2:6443"))),
        ToPeer::NoAddressHeader
    );
}

#[test]
fn the_filter_s_503s_are_status_documents_marked_as_its_own() {
    let r = LocalReply::peer_unavailable(&gvr(), 7);
    assert_eq!(r.status, 503);
    assert_eq!(r.body, peer_unavailable(&gvr(), 7));
    assert_eq!(r.error, Some(ProxyError::PeerUnavailable));
    let headers = |r: &LocalReply| r.headers.iter().map(|(k, v)| (*k, v.clone())).collect::<Vec<_>>();
    assert_eq!(
        headers(&r),
        [
            ("content-type", "application/json".to_string()),
            ("retry-after", "7".to_string()),
            (FILTER_REPLY_HEADER, "true".to_string()),
        ]
    );
    let r = LocalReply::guarded_not_found(&gvr(), 1, Some("abc".into()));
    assert_eq!(r.body, guarded_not_found(&gvr(), 1));
    assert_eq!(r.error, Some(ProxyError::GuardedNotFound));
    assert_eq!(headers(&r).last(), Some(&("audit-id", "abc".to_string())));
    let r = LocalReply::unauthorized("no");
    assert_eq!((r.status, r.error), (401, None));
    assert_eq!(r.body, unauthorized("no"));
    let r = LocalReply::not_ready(b"x".to_vec());
    assert_eq!((r.status, r.body.as_slice()), (503, &b"x"[..]));
    assert!(headers(&r).contains(&(FILTER_REPLY_HEADER, "true".to_string())));
    assert_eq!(
        ProxyError::UpstreamUnreachable.labels(&gvr()),
        [
            ("type", "upstream_unreachable"),
            ("group", "apps"),
            ("version", "v1"),
            ("resource", "deployments")
        ]
    );
}

#[test]
fn a_merged_answer_replaces_length_type_and_etag_and_a_304_its_status() {
    let table = Table {
        apis_etag: "\"A\"".into(),
        ..Table::default()
    };
    let h = merged_headers(MergedDoc::Apis, &table, None, 200).unwrap_or_else(|| unreachable!());
    let edits = h.edits();
    assert_eq!(edits.first(), Some(&("content-length", None)));
    assert!(
        edits.contains(&("content-encoding", None)),
        "the replaced body is not gzipped"
    );
    assert!(edits.contains(&("etag", Some("\"A\""))));
    assert!(!edits.iter().any(|(k, _)| *k == ":status"));
    assert_eq!(h.code(), "200");
    let h = merged_headers(MergedDoc::Apis, &table, Some("\"A\""), 200).unwrap_or_else(|| unreachable!());
    assert_eq!(h.edits().last(), Some(&(":status", Some("304"))));
    assert_eq!(h.code(), "304");
}

#[test]
fn no_certificate_or_no_cn_asserts_nothing_and_a_bad_subject_is_refused() {
    let names = RequestHeaderNames::default();
    assert_eq!(names.assertion(None), Ok(Vec::new()));
    assert_eq!(names.assertion(Some("")), Ok(Vec::new()));
    assert_eq!(names.assertion(Some("O=system:masters")), Ok(Vec::new()));
    let asserted = names.assertion(Some("CN=alice,O=dev")).unwrap_or_default();
    assert_eq!(asserted.first().map(|(_, v)| v.as_str()), Some("alice"));
    assert!(names.assertion(Some("CN=al\\0Aice")).is_err());
}
