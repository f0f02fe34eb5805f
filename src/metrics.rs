//! Metric names, after upstream's `peerproxy/metrics` (prefixed `kube_peer_proxy_` instead of
//! `apiserver_`). Envoy stats have no labels, so label values are encoded in the stat name as
//! `;label=value` and turned back into Prometheus labels by the bootstrap's `stats_tags`
//! (see `envoy/render.py`).

pub const REROUTED: &str = "kube_peer_proxy_rerouted_request_total";
pub const PROXY_ERRORS: &str = "kube_peer_proxy_peer_proxy_errors_total";
pub const SYNC_ERRORS: &str = "kube_peer_proxy_discovery_sync_errors_total";
pub const MERGED_RESPONSES: &str = "kube_peer_proxy_merged_discovery_responses_total";
pub const SNAPSHOT_GENERATION: &str = "kube_peer_proxy_snapshot_generation";
pub const SNAPSHOT_AGE: &str = "kube_peer_proxy_snapshot_age_seconds";
pub const SERVER_FRESH: &str = "kube_peer_proxy_server_fresh";
pub const SERVER_LAST_SUCCESS_AGE: &str = "kube_peer_proxy_server_last_success_age_seconds";

/// Every label name used above; the bootstrap gets one `stats_tags` regex per name.
pub const LABELS: &[&str] = &["code", "group", "version", "resource", "type", "server", "doc"];

/// `name;k1=v1;k2=v2`. Values are sanitised so they cannot break the encoding.
pub fn name(base: &str, labels: &[(&str, &str)]) -> String {
    let mut out = String::from(base);
    for (k, v) in labels {
        out.push(';');
        out.push_str(k);
        out.push('=');
        out.extend(
            v.chars()
                .map(|c| if c == ';' || c == '=' || c.is_control() { '_' } else { c }),
        );
    }
    out
}
