//! The readiness answer before the first snapshot (src/request/readiness.rs).
#![cfg(test)]

use kube_peer_proxy::request::readiness::{is_readiness_path, not_ready};

#[test]
fn readiness_paths_are_readyz_and_healthz_with_any_query() {
    for path in [
        "/readyz",
        "/healthz",
        "/readyz?verbose",
        "/healthz?exclude=etcd&verbose",
    ] {
        assert!(is_readiness_path("GET", path), "{path}");
        assert!(is_readiness_path("HEAD", path), "{path}");
    }
    for path in [
        "/livez",
        "/readyz/etcd",
        "/healthz/ping",
        "/readyz/",
        "/readyzz",
        "/api/readyz",
        "/",
        "",
    ] {
        assert!(!is_readiness_path("GET", path), "{path}");
    }
    assert!(!is_readiness_path("POST", "/readyz"));
    assert!(!is_readiness_path("get", "/readyz"));
}

#[test]
fn before_the_first_snapshot_readiness_is_answered_not_ready() {
    let body = String::from_utf8(not_ready("GET", "/readyz?verbose", false).expect("a reply")).unwrap();
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    assert!(body.starts_with("[-]kube-peer-proxy-routing failed"), "{body}");
    let body = String::from_utf8(not_ready("GET", "/healthz", false).expect("a reply")).unwrap();
    assert!(body.ends_with("healthz check failed\n"), "{body}");
}

#[test]
fn with_a_snapshot_or_off_the_readiness_paths_requests_go_on() {
    assert_eq!(not_ready("GET", "/readyz", true), None);
    assert_eq!(not_ready("GET", "/healthz", true), None);
    assert_eq!(not_ready("GET", "/livez", false), None);
    assert_eq!(not_ready("GET", "/readyz/etcd", false), None);
    assert_eq!(not_ready("GET", "/api/v1/pods", false), None);
}
