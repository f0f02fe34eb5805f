//! Metric names, after upstream's `peerproxy/metrics` (prefixed `kube_peer_proxy_` instead of
//! `apiserver_`). Envoy stats have no labels, so label values are encoded in the stat name as
//! `;label=value` and turned back into Prometheus labels by the bootstrap's `stats_tags`
//! (see `python/kpp/render.py`).

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

/// Whether `v` is written into a name as it is (no byte to replace): the common case, which the
/// request path compares and hashes byte by byte rather than char by char.
fn is_clean(v: &str) -> bool {
    v.bytes()
        .all(|b| b.is_ascii() && b != b';' && b != b'=' && !b.is_ascii_control())
}

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

/// Whether `encoded` is exactly [`name`]`(base, labels)`, compared without building that string,
/// so a cached metric id is found per request without formatting its name.
pub fn is_name(encoded: &str, base: &str, labels: &[(&str, &str)]) -> bool {
    let Some(mut rest) = encoded.strip_prefix(base) else {
        return false;
    };
    for (k, v) in labels {
        let Some(r) = rest
            .strip_prefix(';')
            .and_then(|r| r.strip_prefix(k))
            .and_then(|r| r.strip_prefix('='))
        else {
            return false;
        };
        if is_clean(v) {
            match r.strip_prefix(v) {
                Some(r) => {
                    rest = r;
                    continue;
                }
                None => return false,
            }
        }
        let mut chars = r.chars();
        for c in v.chars() {
            let c = if c == ';' || c == '=' || c.is_control() { '_' } else { c };
            if chars.next() != Some(c) {
                return false;
            }
        }
        rest = chars.as_str();
    }
    rest.is_empty()
}

/// A hash of [`name`]`(base, labels)` computed from the parts (FNV-1a 64 over the same bytes), the
/// key of the per-VM metric id cache.
pub fn name_hash(base: &str, labels: &[(&str, &str)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(base.as_bytes());
    for (k, v) in labels {
        eat(b";");
        eat(k.as_bytes());
        eat(b"=");
        if is_clean(v) {
            eat(v.as_bytes());
            continue;
        }
        let mut buf = [0u8; 4];
        for c in v.chars() {
            let c = if c == ';' || c == '=' || c.is_control() { '_' } else { c };
            eat(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    h
}
