//! The health paths a load balancer checks, answered by the proxy while the node cannot route yet.
//!
//! Before its first discovery snapshot a node serves what its local apiserver serves, but it does not
//! know what the peers serve: a request for a resource only a peer serves gets a 503, and the local
//! apiserver's `/readyz` would still say 200. So until the first snapshot the filter answers `/readyz`
//! and `/healthz` (kubeadm's HA guide has HAProxy check `/healthz`) itself with 503, and a load
//! balancer puts the node back only once it can route. After that they reach the local apiserver,
//! whose answer stands (a down apiserver makes them 503 through Envoy's own reply). `/livez` and the
//! individual checks (`/readyz/etcd`, ...) are always forwarded. While Envoy drains, Envoy's
//! `health_check` filter answers the same paths 503 before this filter runs
//! (`python/kpp/render.py`, `HEALTH_PATH_REGEX`: the same paths as [`is_readiness_path`]).

/// `/readyz` or `/healthz`, with or without a query, for GET or HEAD.
pub fn is_readiness_path(method: &str, path: &str) -> bool {
    if method != "GET" && method != "HEAD" {
        return false;
    }
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    path == "/readyz" || path == "/healthz"
}

/// The body of the proxy's 503 for a readiness path before the first snapshot, or `None` when the
/// request goes on (not a readiness path, or a snapshot exists). The text follows kube-apiserver's
/// verbose health output: one failed check, then the verdict.
pub fn not_ready(method: &str, path: &str, has_snapshot: bool) -> Option<Vec<u8>> {
    if has_snapshot || !is_readiness_path(method, path) {
        return None;
    }
    let what = if path.starts_with("/healthz") {
        "healthz"
    } else {
        "readyz"
    };
    Some(
        format!(
            "[-]kube-peer-proxy-routing failed: kube-peer-proxy: no discovery snapshot yet, the peers' APIs are not known\n{what} check failed\n"
        )
        .into_bytes(),
    )
}
