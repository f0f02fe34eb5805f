//! Passive health, the whole cycle in one place; shared by both walks (only the adapters in
//! `src/wasm/` read or write the shared data, with the keys and values decided here).
//!
//! * **Mark**: a filter that rerouted a request to a peer and got Envoy's own reply for a connect
//!   failure ([`upstream`] of `response.code_details`) writes the time (ms) under [`down_key`] of
//!   that peer's target.
//! * **Read**: routing asks [`is_down`] only about the peers that serve a rerouted request, and
//!   each question reads that peer's mark from shared data (one `get_shared_data`), so every
//!   worker sees a mark, and its clearing, from the next request on. An earlier version read the
//!   marks on each worker's timer instead (no shared-data read per request): then every worker
//!   still picked the dead peer until its own timer ran, one failed request per worker (32 on a
//!   32-thread node) instead of one.
//! * **Clear**: the discovery service writes [`CLEARED`] when the marked peer answered a discovery
//!   round after the mark ([`recovered`]), before it publishes the snapshot that shows it healthy.
//!
//! A mark is separate from the table's `unhealthy` set, which the discovery walk sets itself when a
//! discovery call cannot connect.

use crate::snapshot::Table;

/// Where the mark of `target` ([`crate::snapshot::ServerRef::target`]: the cluster, or the address
/// of a peer learned from a lease) lives in shared data: the time of the mark (ms), or empty. Short
/// (`kpp.d/` and the target), so that the host looks a cluster's mark up without allocating its key
/// (proxy-wasm-cpp-host `SharedData::get` copies the key into a `std::string`), and written out
/// without `format!`: every rerouted request reads the mark of each peer it could go to.
pub fn down_key(target: &str) -> String {
    let mut key = String::with_capacity(DOWN_PREFIX.len() + target.len());
    key.push_str(DOWN_PREFIX);
    key.push_str(target);
    key
}

const DOWN_PREFIX: &str = "kpp.d/";

/// The value of a cleared mark: empty, so reading it copies nothing into the VM.
pub const CLEARED: &[u8] = b"";

/// The value a mark is written with.
pub fn mark_value(now_ms: u64) -> String {
    now_ms.to_string()
}

/// Whether a value read under [`down_key`] is a mark (absent, cleared or `0`: not marked).
pub fn is_marked(value: Option<u64>) -> bool {
    value.is_some_and(|t| t != 0)
}

/// What Envoy's `response.code_details` says about a rerouted request's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// The peer answered (`via_upstream`, or nothing recorded).
    Answered,
    /// Envoy could not connect to the peer: mark it down until it answers discovery again.
    ConnectFailure,
    /// Envoy answered itself for another reason (timeout, reset, overflow, ...).
    EnvoyReply,
}

/// Whether an answer with this `:status` can be one Envoy made itself for a rerouted request
/// (connect failure, timeout, reset, overflow: all 5xx). Below 500 the peer answered, and the
/// filter skips reading `response.code_details` (a property read is one of the dearer host calls).
pub fn maybe_envoy_reply(status: &str) -> bool {
    status.parse::<u16>().map_or(true, |s| s >= 500)
}

pub fn upstream(code_details: &str) -> Upstream {
    if code_details.contains("connection_failure") {
        Upstream::ConnectFailure
    } else if code_details.is_empty() || code_details == "via_upstream" {
        Upstream::Answered
    } else {
        Upstream::EnvoyReply
    }
}

/// Whether `table.servers[index]` is marked down; `read(key)` is the shared-data value under a
/// key. Asked per candidate peer of a rerouted request, so a mark one worker writes holds on every
/// worker from the next request on: a dead peer costs the cluster one failed request (plus any
/// already in flight to it), not one per Envoy worker.
pub fn is_down(table: Option<&Table>, index: usize, read: &mut dyn FnMut(&str) -> Option<u64>) -> bool {
    table
        .and_then(|t| t.servers.get(index))
        .is_some_and(|server| is_marked(read(&down_key(server.target()))))
}

/// The marks the discovery service clears: `(target, key)` of each server in `answering`
/// (`(target, last answer ms)`, see [`crate::discovery::sync::Syncer::answering_clusters`]) whose
/// mark is older than its last answer. A mark made after that answer stays.
pub fn recovered<'a>(
    answering: impl Iterator<Item = (&'a str, u64)>,
    read: &mut dyn FnMut(&str) -> Option<u64>,
) -> Vec<(&'a str, String)> {
    answering
        .filter_map(|(target, last_success)| {
            let key = down_key(target);
            let mark = read(&key).unwrap_or(0);
            (mark != 0 && last_success > mark).then_some((target, key))
        })
        .collect()
}
