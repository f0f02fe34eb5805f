//! kube-peer-proxy: Kubernetes' Mixed Version Proxy (KEP-4020) as a proxy-wasm filter for Envoy.
//!
//! The pure core (request grammar, discovery parsing and merging, the serving table, the routing
//! decision, configuration) has no host calls and is tested natively; `wasm` holds the thin
//! proxy-wasm adapters: the HTTP filter and the singleton discovery service.

pub mod accept;
pub mod config;
pub mod discovery;
pub mod discovery_sync;
pub mod guard;
pub mod health;
pub mod identity;
pub mod leases;
pub mod merge;
pub mod metrics;
pub mod not_found;
pub mod reply;
pub mod request_info;
pub mod routing;
pub mod snapshot;
pub mod status;

#[cfg(target_arch = "wasm32")]
mod wasm;
