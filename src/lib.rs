//! kube-peer-proxy: Kubernetes' Mixed Version Proxy (KEP-4020) as a proxy-wasm filter for Envoy.
//!
//! Two walks, each a pure core with no host calls, tested natively:
//! * [`request`]: one client request through the HTTP filter: its path parsed, routed (local, a
//!   peer, 503, or the merged discovery document), its 404 guarded, its answer rewritten;
//! * [`discovery`]: the singleton discovery service's rounds: membership, the discovery documents
//!   of every member, the merge, and the snapshot it publishes.
//!
//! Shared by both: [`config`], [`snapshot`] (the serving table the discovery walk publishes and the
//! request walk reads, with [`entry_cache`], the entries a worker looked up lately), [`passive_health`] (marks written by one walk, cleared by the other),
//! [`metrics`] (names), [`header_map`] (the ABI's serialized headers, read in place) and
//! [`PEER_PROXIED_HEADER`]. `wasm` holds the thin proxy-wasm adapters that
//! carry out their steps with host calls: the HTTP filter, the discovery service, the peer gate.

pub mod config;
pub mod discovery;
pub mod entry_cache;
pub mod fnv;
pub mod header_map;
pub mod metrics;
pub mod passive_health;
pub mod request;
pub mod snapshot;

/// Set on every request a proxy sends to another server (a rerouted request, a discovery call):
/// the receiving proxy serves it locally (loop prevention), as upstream's handler does.
pub const PEER_PROXIED_HEADER: &str = "x-kubernetes-peer-proxied";

#[cfg(target_arch = "wasm32")]
mod wasm;
