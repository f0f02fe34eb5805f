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
