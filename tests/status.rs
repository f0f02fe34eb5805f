//! Bodies the filter answers itself, and metric name encoding.
#![cfg(test)]

use kube_peer_proxy::metrics;
use kube_peer_proxy::request::reply::{guarded_not_found, peer_unavailable};
use kube_peer_proxy::request::routing::Gvr;

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).expect("Status is JSON")
}

#[test]
fn guarded_not_found_is_a_503_status() {
    let gvr = Gvr {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        resource: "mutatingadmissionpolicies".into(),
    };
    let v = json(&guarded_not_found(&gvr, 7));
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["metadata"], serde_json::json!({}));
    assert_eq!(v["status"], "Failure");
    assert_eq!(v["reason"], "ServiceUnavailable");
    assert_eq!(v["code"], 503);
    assert_eq!(v["details"]["retryAfterSeconds"], 7);
    let message = v["message"].as_str().expect("message");
    assert!(
        message.contains("admissionregistration.k8s.io/v1/mutatingadmissionpolicies"),
        "{message}"
    );
    assert_eq!(v["details"]["kind"], "mutatingadmissionpolicies");
}

#[test]
fn peer_unavailable_names_the_resource() {
    struct Row {
        desc: &'static str,
        gvr: Gvr<'static>,
        what: &'static str,
    }
    let rows = [
        Row {
            desc: "group resource",
            gvr: Gvr {
                group: "resource.k8s.io".into(),
                version: "v1".into(),
                resource: "resourceclaims".into(),
            },
            what: "resource.k8s.io/v1/resourceclaims",
        },
        Row {
            desc: "core resource",
            gvr: Gvr {
                group: "".into(),
                version: "v1".into(),
                resource: "pods".into(),
            },
            what: "v1/pods",
        },
    ];
    for row in rows {
        let v = json(&peer_unavailable(&row.gvr, 3));
        assert_eq!(v["kind"], "Status", "{}", row.desc);
        assert_eq!(v["code"], 503, "{}", row.desc);
        assert_eq!(v["reason"], "ServiceUnavailable", "{}", row.desc);
        assert_eq!(v["details"]["retryAfterSeconds"], 3, "{}", row.desc);
        assert_eq!(v["details"]["group"], &*row.gvr.group, "{}", row.desc);
        assert_eq!(v["details"]["kind"], &*row.gvr.resource, "{}", row.desc);
        let message = v["message"].as_str().expect("message");
        assert!(message.contains(row.what), "{}: {message}", row.desc);
    }
}

#[test]
fn metric_names_encode_labels() {
    assert_eq!(
        metrics::name(metrics::REROUTED, &[]),
        "kube_peer_proxy_rerouted_request_total"
    );
    assert_eq!(
        metrics::name(
            metrics::REROUTED,
            &[
                ("code", "200"),
                ("group", "apps"),
                ("version", "v1"),
                ("resource", "deployments")
            ]
        ),
        "kube_peer_proxy_rerouted_request_total;code=200;group=apps;version=v1;resource=deployments"
    );
    // Separators and control characters in values cannot break the encoding.
    assert_eq!(metrics::name("m", &[("server", "a;b=c\nd")]), "m;server=a_b_c_d");
    assert_eq!(metrics::name("m", &[("group", "")]), "m;group=");
    for base in [
        metrics::REROUTED,
        metrics::PROXY_ERRORS,
        metrics::SYNC_ERRORS,
        metrics::MERGED_RESPONSES,
        metrics::SNAPSHOT_GENERATION,
        metrics::SNAPSHOT_AGE,
        metrics::SERVER_FRESH,
        metrics::SERVER_LAST_SUCCESS_AGE,
    ] {
        assert!(base.starts_with("kube_peer_proxy_"), "{base}");
        assert!(!base.contains(';') && !base.contains('='), "{base}");
    }
    for label in ["code", "group", "version", "resource", "type", "server"] {
        assert!(metrics::LABELS.contains(&label), "{label}");
    }
}
