//! Kubernetes `Status` bodies for the replies the filter makes itself.

/// 503 while no discovery snapshot exists: clients retry instead of believing a false 404.
pub fn not_ready(retry_after_seconds: u32) -> Vec<u8> {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "kube-peer-proxy: the discovery snapshot is not ready yet, please try again",
        "reason": "ServiceUnavailable",
        "details": {"retryAfterSeconds": retry_after_seconds},
        "code": 503,
    })
    .to_string()
    .into_bytes()
}

/// 503 when the only servers that serve a resource are unreachable right now: the resource exists
/// in the cluster, so a 404 would be false (upstream's KEP: "unreachable resources must be 503").
pub fn peer_unavailable(gvr: &crate::routing::Gvr, retry_after_seconds: u32) -> Vec<u8> {
    let what = if gvr.group.is_empty() {
        format!("{}/{}", gvr.version, gvr.resource)
    } else {
        format!("{}/{}/{}", gvr.group, gvr.version, gvr.resource)
    };
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
