//! proxy-wasm entry point. One module, three roles chosen by the plugin's root id: the singleton
//! discovery service (`kube-peer-proxy-discovery`, an `envoy.bootstrap.wasm` service), the peer
//! listener's gate (`kube-peer-proxy-peer-gate`) and the HTTP filter (any other root id). The
//! service and the filter share data through the same `vm_id`.

mod asking;
mod filter;
mod host;
mod merged;
mod peer_gate;
mod service;
mod worker;

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

use crate::config::{Config, PeerGateConfig, DISCOVERY_ROOT_ID, PEER_GATE_ROOT_ID};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(Root { context_id, role: Role::Unconfigured })
    });
}}

/// Timer period of both roles: a quarter of the refresh interval (50 ms to 1 s), so rounds start
/// on time and workers pick up a new snapshot soon after it is published.
fn tick_period(config: &Config) -> Duration {
    (config.refresh_interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

enum Role {
    Unconfigured,
    Filter(Rc<worker::Shared>),
    Service(Box<service::Service>),
    PeerGate(Rc<PeerGateConfig>, Option<u32>),
}

struct Root {
    context_id: u32,
    role: Role,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        if let Role::Service(s) = &mut self.role {
            s.on_http_call_response(token, num_headers, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = proxy_wasm::hostcalls::get_buffer(proxy_wasm::types::BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let root_id = host::property(&["plugin_root_id"]).unwrap_or_default();
        if root_id == PEER_GATE_ROOT_ID {
            return match PeerGateConfig::parse(&raw) {
                Ok(c) => {
                    self.role = Role::PeerGate(Rc::new(c), peer_gate::define_refused());
                    true
                }
                Err(e) => {
                    log::error!("kube-peer-proxy: invalid peer gate configuration: {e}");
                    false
                }
            };
        }
        let config = match Config::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                // Envoy refuses the filter when on_configure returns false; this line says why.
                log::error!("kube-peer-proxy: invalid plugin configuration: {e}");
                return false;
            }
        };
        if root_id == DISCOVERY_ROOT_ID {
            if let Err(e) = proxy_wasm::hostcalls::set_tick_period(tick_period(&config)) {
                log::error!("kube-peer-proxy: cannot start the discovery timer: {e:?}");
                return false;
            }
            log::info!(
                "kube-peer-proxy {} discovery service configured",
                env!("CARGO_PKG_VERSION")
            );
            self.role = Role::Service(Box::new(service::Service::new(config)));
        } else {
            // Each worker's filter VM loads new snapshots on its own timer, off the request path.
            if let Err(e) = proxy_wasm::hostcalls::set_tick_period(tick_period(&config)) {
                log::warn!("kube-peer-proxy: no filter timer ({e:?}); snapshots load on requests only");
            }
            self.role = Role::Filter(Rc::new(worker::Shared::new(config, self.context_id)));
        }
        true
    }

    fn on_tick(&mut self) {
        match &mut self.role {
            Role::Service(s) => s.on_tick(),
            Role::Filter(shared) => shared.on_tick(),
            Role::PeerGate(..) | Role::Unconfigured => {}
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        match &self.role {
            Role::Filter(shared) => Some(Box::new(filter::PeerProxy::new(shared.clone()))),
            Role::PeerGate(config, refused) => Some(Box::new(peer_gate::Gate::new(config.clone(), *refused))),
            _ => None,
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
