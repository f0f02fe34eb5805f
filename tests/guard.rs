//! The 404 guard's pure parts: what is asked, how an answer reads, and the verdict.
#![cfg(test)]

mod common;

use common::{group, res, ver};
use kube_peer_proxy::guard::{first_look, listed, question, verdict, First, Question, Verdict};
use kube_peer_proxy::routing::Gvr;
use kube_peer_proxy::snapshot::{ServerDiscovery, ServerRef, Table};

fn table() -> Table {
    let d = ServerDiscovery {
        core: vec![group("", vec![ver("v1", vec![res("pods", &["status", "resize"])])])],
        groups: Vec::new(),
    };
    let s = ServerRef {
        name: "a".into(),
        cluster: "local".into(),
        local: true,
        address: None,
    };
    Table::build(&[(s, &d)])
}

fn q(path: &str, name: Option<&str>, g: &str, v: &str, r: &str) -> Question {
    Question {
        path: path.into(),
        name: name.map(str::to_string),
        gvr: Gvr {
            group: g.into(),
            version: v.into(),
            resource: r.into(),
        },
    }
}

#[test]
fn questions() {
    let t = table();
    let rows: [(&str, &str, Option<Question>); 9] = [
        (
            "GET",
            "/api/v1/namespaces/a/pods/p",
            Some(q("/api/v1", Some("pods"), "", "v1", "pods")),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p/resize",
            Some(q("/api/v1", Some("pods/resize"), "", "v1", "pods")),
        ),
        // A subresource nobody is known to serve was routed on its parent: ask about the parent.
        (
            "GET",
            "/api/v1/namespaces/a/pods/p/bogus",
            Some(q("/api/v1", Some("pods"), "", "v1", "pods")),
        ),
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
            Some(q(
                "/apis/admissionregistration.k8s.io/v1",
                Some("mutatingadmissionpolicies"),
                "admissionregistration.k8s.io",
                "v1",
                "mutatingadmissionpolicies",
            )),
        ),
        (
            "GET",
            "/apis/batch/v1",
            Some(q("/apis/batch/v1", None, "batch", "v1", "")),
        ),
        ("GET", "/apis/batch", Some(q("/apis/batch", None, "batch", "", ""))),
        ("GET", "/api/v2", Some(q("/api/v2", None, "", "v2", ""))),
        ("GET", "/healthz", None),
        ("GET", "/apis", None),
    ];
    for (method, path, want) in rows {
        assert_eq!(question(method, path, Some(&t)), want, "{path}");
    }
    // While some member's API set is unknown, that member may serve the subresource: ask about it.
    let mut incomplete = t.clone();
    incomplete.membership_unknown = true;
    assert_eq!(
        question("GET", "/api/v1/namespaces/a/pods/p/bogus", Some(&incomplete)).and_then(|q| q.name),
        Some("pods/bogus".to_string())
    );
    // Without a table every subresource is asked about as such.
    assert_eq!(
        question("GET", "/api/v1/namespaces/a/pods/p/bogus", None).and_then(|q| q.name),
        Some("pods/bogus".to_string())
    );
}

#[test]
fn first_look_at_a_404() {
    let res = q("/api/v1", Some("pods"), "", "v1", "pods");
    let disc = q("/apis/batch/v1", None, "batch", "v1", "");
    assert_eq!(first_look("text/plain; charset=utf-8", &res), First::TypeNotServed);
    assert_eq!(first_look("application/json", &res), First::AskServer);
    assert_eq!(
        first_look("application/vnd.kubernetes.protobuf", &res),
        First::AskServer
    );
    assert_eq!(first_look("application/yaml", &res), First::AskServer);
    assert_eq!(first_look("", &res), First::AskServer);
    assert_eq!(first_look("application/json", &disc), First::TypeNotServed);
}

#[test]
fn answers() {
    let list = br#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"v1","resources":[
        {"name":"pods","namespaced":true,"kind":"Pod","verbs":["get"]},
        {"name":"pods/status","namespaced":true,"kind":"Pod","verbs":["get"]}]}"#;
    let pods = q("/api/v1", Some("pods"), "", "v1", "pods");
    let resize = q("/api/v1", Some("pods/resize"), "", "v1", "pods");
    let disc = q("/apis/batch/v1", None, "batch", "v1", "");
    assert_eq!(listed(&pods, 200, list), Some(true));
    assert_eq!(listed(&resize, 200, list), Some(false));
    assert_eq!(listed(&pods, 404, b"404 page not found\n"), Some(false));
    assert_eq!(listed(&pods, 200, b"{not json"), None);
    assert_eq!(listed(&pods, 200, br#"{"kind":"Status"}"#), None);
    assert_eq!(
        listed(&pods, 503, b""),
        None,
        "Envoy's connect failure: cannot be asked"
    );
    assert_eq!(listed(&pods, 0, b""), None);
    assert_eq!(listed(&pods, 401, b""), None);
    assert_eq!(listed(&disc, 200, b"anything"), Some(true));
    assert_eq!(listed(&disc, 404, b""), Some(false));
}

/// (the answering server's answer, last seen to serve it there, strict, the other members' answers, verdict, why)
type VerdictRow = (Option<bool>, bool, bool, &'static [Option<bool>], Verdict, &'static str);

#[test]
fn verdicts() {
    use Verdict::*;
    #[rustfmt::skip]
    let rows: [VerdictRow; 12] = [
        (Some(true), false, true, &[], Stand, "the answering server serves the type: an object's 404"),
        (Some(true), false, false, &[Some(true)], Stand, "an object's 404 stands whatever others say"),
        (Some(false), true, true, &[], Unavailable, "strict: a type-404 might be false, whatever the table said"),
        (None, false, false, &[], Unavailable, "the answering server cannot say and was not seen to serve it"),
        (None, true, true, &[], Stand, "cannot be asked (e.g. discovery refused) but last seen to serve it: an object's 404"),
        (None, true, false, &[Some(true)], Stand, "same, in verified mode"),
        (Some(false), true, false, &[], Stand, "its discovery says now it does not serve it (the table is old), nobody else does"),
        (Some(false), false, false, &[], Stand, "nobody else is a member: genuine"),
        (Some(false), false, false, &[Some(false), Some(false)], Stand, "nobody serves it now: genuine"),
        (Some(false), false, false, &[None, Some(false)], Stand, "a member that cannot be asked counts as last seen"),
        (Some(false), false, false, &[Some(false), Some(true)], Unavailable, "a member serves it now"),
        (Some(false), false, false, &[Some(true), None], Unavailable, "a member serves it now"),
    ];
    for (answering, last_seen, strict, others, want, why) in rows {
        assert_eq!(verdict(answering, last_seen, strict, others), want, "{why}");
    }
}

#[test]
fn table_keys_of_questions() {
    use kube_peer_proxy::snapshot::{group_key, resource_key, subresource_key, version_key};
    assert_eq!(
        q("/api/v1", Some("pods"), "", "v1", "pods").table_key(),
        resource_key("", "v1", "pods")
    );
    assert_eq!(
        q("/api/v1", Some("pods/resize"), "", "v1", "pods").table_key(),
        subresource_key("", "v1", "pods", "resize")
    );
    assert_eq!(
        q("/apis/batch/v1", None, "batch", "v1", "").table_key(),
        version_key("batch", "v1")
    );
    assert_eq!(q("/apis/batch", None, "batch", "", "").table_key(), group_key("batch"));
}
