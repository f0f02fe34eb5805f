//! kube-peer-proxy: Kubernetes' Mixed Version Proxy (KEP-4020) as a proxy-wasm filter for Envoy.
//!
//! The pure core (request grammar, discovery parsing and merging, the serving table, the routing
//! decision, configuration) has no host calls and is tested natively; `wasm` holds the thin
//! proxy-wasm adapters: the HTTP filter and the singleton discovery service.

pub mod accept;
pub mod config;
pub mod discovery;
pub mod guard;
pub mod health;
pub mod identity;
pub mod metrics;
pub mod not_found;
pub mod reply;
pub mod request_info;
pub mod routing;
pub mod snapshot;
pub mod status;

/// Set on every request a proxy sends to another server (a rerouted request, a discovery call):
/// the receiving proxy serves it locally (loop prevention), as upstream's handler does.
pub const PEER_PROXIED_HEADER: &str = "x-kubernetes-peer-proxied";

#[cfg(target_arch = "wasm32")]
mod wasm;
