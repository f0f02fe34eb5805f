//! Metric names, after upstream's `peerproxy/metrics` (prefixed `kube_peer_proxy_` instead of
//! `apiserver_`). Envoy stats have no labels, so label values are encoded in the stat name as
//! `;label=value` and turned back into Prometheus labels by the bootstrap's `stats_tags`
//! (see `python/kpp/render.py`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::fnv::Fnv64;

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

/// The ids of the labelled counters a VM defined, found by base and label values: a request
/// formats no metric name once its label set was seen (Envoy stats have no labels, so each label
/// set is its own stat, defined once per VM). Bounded: past [`LabelledIds::CAPACITY`] label sets
/// (label values come from request paths) it forgets them all, and the next ones are defined again
/// (Envoy finds the same stat by name).
#[derive(Default)]
pub struct LabelledIds {
    sets: HashMap<u64, Vec<LabelledId>, BuildHasherDefault<Fnv64>>,
    len: usize,
}

struct LabelledId {
    base: Box<str>,
    values: Box<[Box<str>]>,
    id: u32,
}

impl LabelledIds {
    pub const CAPACITY: usize = 4096;

    /// The id of `base` with `labels`: known, or `define(name(base, labels))` remembered.
    pub fn id(&mut self, base: &str, labels: &[(&str, &str)], define: impl FnOnce(&str) -> Option<u32>) -> Option<u32> {
        let mut h = Fnv64::default();
        h.write(base.as_bytes());
        for (_, v) in labels {
            h.write(&[0]);
            h.write(v.as_bytes());
        }
        let key = h.finish();
        let same = |l: &LabelledId| {
            *l.base == *base
                && l.values.len() == labels.len()
                && l.values.iter().zip(labels).all(|(a, (_, b))| **a == **b)
        };
        if let Some(l) = self.sets.get(&key).and_then(|slot| slot.iter().find(|l| same(l))) {
            return Some(l.id);
        }
        let id = define(&name(base, labels))?;
        if self.len >= Self::CAPACITY {
            self.sets.clear();
            self.len = 0;
        }
        self.sets.entry(key).or_default().push(LabelledId {
            base: base.into(),
            values: labels.iter().map(|(_, v)| Box::<str>::from(*v)).collect(),
            id,
        });
        self.len += 1;
        Some(id)
    }
}
