//! Kubernetes `Status` bodies for the replies the filter makes itself.

fn what(gvr: &crate::request::routing::Gvr) -> String {
    [&*gvr.group, &*gvr.version, &*gvr.resource]
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

/// Set on the replies the filter makes itself, which already are `Status` documents (or a health
/// answer), so Envoy's local-reply mapper leaves them alone (see `python/kpp/render.py`).
pub const FILTER_REPLY_HEADER: &str = "x-kube-peer-proxy-reply";

/// Why the filter answered 503 itself, or why a rerouted request failed: the `type` label of
/// `peer_proxy_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyError {
    /// Only unreachable or stale servers serve the resource ([`peer_unavailable`]).
    PeerUnavailable,
    /// A 404 that might be false ([`guarded_not_found`]).
    GuardedNotFound,
    /// Envoy answered a rerouted request itself (connect failure, timeout, reset).
    UpstreamUnreachable,
}

impl ProxyError {
    pub const ALL: [ProxyError; 3] = [
        ProxyError::PeerUnavailable,
        ProxyError::GuardedNotFound,
        ProxyError::UpstreamUnreachable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ProxyError::PeerUnavailable => "peer_unavailable",
            ProxyError::GuardedNotFound => "guarded_not_found",
            ProxyError::UpstreamUnreachable => "upstream_unreachable",
        }
    }

    /// The labels of `peer_proxy_errors_total` for a request about `gvr`.
    pub fn labels<'g>(self, gvr: &'g crate::request::routing::Gvr) -> [(&'static str, &'g str); 4] {
        [
            ("type", self.label()),
            ("group", &gvr.group),
            ("version", &gvr.version),
            ("resource", &gvr.resource),
        ]
    }
}

/// A reply the filter sends itself, in place of the apiserver's (or before asking it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// Counted as `peer_proxy_errors_total{type}` when set.
    pub error: Option<ProxyError>,
}

impl LocalReply {
    /// 503 Status with Retry-After: only unreachable or stale servers serve `gvr`.
    pub fn peer_unavailable(gvr: &crate::request::routing::Gvr, retry_after_seconds: u32) -> LocalReply {
        let body = peer_unavailable(gvr, retry_after_seconds);
        LocalReply::unavailable(ProxyError::PeerUnavailable, body, retry_after_seconds, None)
    }

    /// 503 Status with Retry-After in place of a 404 that might be false. The apiserver's
    /// `Audit-Id` goes along, so the client's 503 and the apiserver's audit event of that 404 can be
    /// matched.
    pub fn guarded_not_found(
        gvr: &crate::request::routing::Gvr,
        retry_after_seconds: u32,
        audit_id: Option<String>,
    ) -> LocalReply {
        let body = guarded_not_found(gvr, retry_after_seconds);
        LocalReply::unavailable(ProxyError::GuardedNotFound, body, retry_after_seconds, audit_id)
    }

    fn unavailable(error: ProxyError, body: Vec<u8>, retry_after_seconds: u32, audit_id: Option<String>) -> LocalReply {
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("retry-after", retry_after_seconds.to_string()),
            (FILTER_REPLY_HEADER, "true".to_string()),
        ];
        if let Some(id) = audit_id {
            headers.push(("audit-id", id));
        }
        LocalReply {
            status: 503,
            headers,
            body,
            error: Some(error),
        }
    }

    /// A load balancer's readiness check before the first snapshot (see
    /// [`crate::request::readiness`]).
    pub fn not_ready(body: Vec<u8>) -> LocalReply {
        LocalReply {
            status: 503,
            headers: vec![
                ("content-type", "text/plain; charset=utf-8".to_string()),
                ("cache-control", "no-cache, private".to_string()),
                (FILTER_REPLY_HEADER, "true".to_string()),
            ],
            body,
            error: None,
        }
    }

    /// 401 for a client certificate whose identity cannot be asserted (see [`unauthorized`]).
    pub fn unauthorized(message: &str) -> LocalReply {
        LocalReply {
            status: 401,
            headers: vec![
                ("content-type", "application/json".to_string()),
                (FILTER_REPLY_HEADER, "true".to_string()),
            ],
            body: unauthorized(message),
            error: None,
        }
    }
}
