//! The pure response-side decisions: merged discovery headers and 304s (`request::response`), Envoy's
//! code details (`passive_health`), discovery call outcomes (`discovery::sync::answers`).
#![cfg(test)]

use kube_peer_proxy::discovery::documents::CONTENT_TYPE_V2;
use kube_peer_proxy::discovery::sync::answers::call_outcome;
use kube_peer_proxy::discovery::sync::{Body, Outcome};
use kube_peer_proxy::passive_health::{upstream, Upstream};
use kube_peer_proxy::request::response::{merged_headers, MergedHeaders};
use kube_peer_proxy::request::routing::MergedDoc;
use kube_peer_proxy::snapshot::Table;

fn table() -> Table {
    Table {
        apis_etag: "\"A\"".into(),
        api_etag: "\"B\"".into(),
        apis_legacy_etag: "\"C\"".into(),
        ..Table::default()
    }
}

#[test]
fn merged_discovery_headers() {
    let t = table();
    let h = |status, etag: &str, content_type, label| MergedHeaders {
        status,
        content_type,
        etag: etag.into(),
        label,
    };
    assert_eq!(
        merged_headers(MergedDoc::Apis, &t, None, 200),
        Some(h(200, "\"A\"", CONTENT_TYPE_V2, "apis"))
    );
    assert_eq!(
        merged_headers(MergedDoc::Api, &t, Some("\"B\""), 200),
        Some(h(304, "\"B\"", CONTENT_TYPE_V2, "api"))
    );
    assert_eq!(
        merged_headers(MergedDoc::ApisLegacy, &t, Some("\"A\""), 200),
        Some(h(200, "\"C\"", "application/json", "apis_legacy")),
        "another document's ETag is no match"
    );
    // Exact comparison, like upstream: no weak ETags, no lists, no unquoted forms.
    for inm in ["W/\"A\"", "\"A\", \"X\"", "A", "*"] {
        assert_eq!(
            merged_headers(MergedDoc::Apis, &t, Some(inm), 200).map(|h| h.status),
            Some(200),
            "{inm}"
        );
    }
    // The local server's refusal stands.
    for status in [401, 403, 406, 500, 304, 0] {
        assert_eq!(merged_headers(MergedDoc::Apis, &t, None, status), None, "{status}");
    }
}

#[test]
fn envoy_code_details() {
    assert_eq!(upstream("via_upstream"), Upstream::Answered);
    assert_eq!(upstream(""), Upstream::Answered);
    assert_eq!(
        upstream("upstream_reset_before_response_started{connection_failure}"),
        Upstream::ConnectFailure
    );
    assert_eq!(
        upstream("upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_111}"),
        Upstream::ConnectFailure
    );
    assert_eq!(upstream("response_timeout"), Upstream::EnvoyReply);
    assert_eq!(
        upstream("upstream_reset_after_response_started{remote_reset}"),
        Upstream::EnvoyReply
    );
}

#[test]
fn discovery_call_outcomes() {
    assert_eq!(
        call_outcome(503, false, String::new(), None, Body::Bytes(Vec::new())),
        Outcome::Unreachable
    );
    let from_server = call_outcome(503, true, "application/json".into(), None, Body::Bytes(b"{}".to_vec()));
    assert!(
        matches!(from_server, Outcome::Response { status: 503, .. }),
        "the server's own 503"
    );
    let ok = call_outcome(
        200,
        true,
        CONTENT_TYPE_V2.into(),
        Some("\"E\"".into()),
        Body::Bytes(b"x".to_vec()),
    );
    assert_eq!(
        ok,
        Outcome::Response {
            status: 200,
            content_type: CONTENT_TYPE_V2.into(),
            etag: Some("\"E\"".into()),
            body: Body::Bytes(b"x".to_vec())
        }
    );
    assert!(matches!(
        call_outcome(404, false, String::new(), None, Body::Bytes(Vec::new())),
        Outcome::Response { status: 404, .. }
    ));
}

#[test]
fn only_5xx_can_be_envoys_own_reply() {
    use kube_peer_proxy::passive_health::maybe_envoy_reply;
    for (status, maybe) in [
        ("200", false),
        ("404", false),
        ("499", false),
        ("500", true),
        ("503", true),
        ("504", true),
        ("", true),
        ("x", true),
    ] {
        assert_eq!(maybe_envoy_reply(status), maybe, "{status:?}");
    }
}
