//! Kubernetes `Status` bodies for the replies the filter makes itself.

fn what(gvr: &crate::request::routing::Gvr) -> String {
    [gvr.group.as_str(), gvr.version.as_str(), gvr.resource.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/")
}

/// 503 when the only servers that serve a resource are unreachable right now (or their data is
/// stale): the resource exists in the cluster, so a 404 would be false (upstream's KEP:
/// "unreachable resources must be 503").
pub fn peer_unavailable(gvr: &crate::request::routing::Gvr, retry_after_seconds: u32) -> Vec<u8> {
    let what = what(gvr);
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("kube-peer-proxy: the apiservers that serve {what} are unreachable, please try again"),
        "reason": "ServiceUnavailable",
        "details": {"group": gvr.group, "kind": gvr.resource, "retryAfterSeconds": retry_after_seconds},
        "code": 503,
    })
    .to_string()
    .into_bytes()
}

/// 503 in place of an apiserver's "not served here" 404 while that 404 might be false: a peer is
/// known to serve the resource, or some apiserver's API set is not known yet.
pub fn guarded_not_found(gvr: &crate::request::routing::Gvr, retry_after_seconds: u32) -> Vec<u8> {
    let what = what(gvr);
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("kube-peer-proxy: {what} is not served by this apiserver, but another apiserver may serve it; please try again"),
        "reason": "ServiceUnavailable",
        "details": {"group": gvr.group, "kind": gvr.resource, "retryAfterSeconds": retry_after_seconds},
        "code": 503,
    })
    .to_string()
    .into_bytes()
}

/// 401 for a verified client certificate whose identity cannot be asserted faithfully (for example a
/// subject the parser refuses): never guessed at, never downgraded to anonymous.
pub fn unauthorized(message: &str) -> Vec<u8> {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("kube-peer-proxy: {message}"),
        "reason": "Unauthorized",
        "code": 401,
    })
    .to_string()
    .into_bytes()
}
