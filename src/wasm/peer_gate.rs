//! The peer listener's gate: only another node's proxy may assert identities there. Envoy has
//! verified the client certificate against the front-proxy CA; this checks its subject CN against
//! the allowed names exactly as kube-apiserver's `--requestheader-allowed-names` does
//! ([`identity::peer_allowed`]). Envoy's RBAC `principal_name` cannot: it matches a URI or DNS SAN
//! first, so a front-proxy-CA certificate with CN `evil-proxy` and a SAN spelling
//! `CN=front-proxy-client` passed it.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MetricType};

use super::host;
use crate::config::PeerGateConfig;
use crate::request::identity;
use crate::request::reply::LocalReply;

/// Requests the gate refused (certificate subject not allowed).
pub const REFUSED: &str = "kube_peer_proxy_peer_listener_refused_total";

pub struct Gate {
    config: std::rc::Rc<PeerGateConfig>,
    refused_metric: Option<u32>,
}

impl Gate {
    pub fn new(config: std::rc::Rc<PeerGateConfig>, refused_metric: Option<u32>) -> Gate {
        Gate { config, refused_metric }
    }
}

/// The refusal counter, defined once per worker.
pub fn define_refused() -> Option<u32> {
    hostcalls::define_metric(MetricType::Counter, REFUSED).ok()
}

impl Context for Gate {}

impl HttpContext for Gate {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let subject = host::property(&["connection", "subject_peer_certificate"]).unwrap_or_default();
        let Err(why) = identity::peer_allowed(&subject, &self.config.allowed_names) else {
            return Action::Continue;
        };
        log::warn!("kube-peer-proxy: peer listener refused a client certificate: {why} (subject {subject:?})");
        if let Some(id) = self.refused_metric {
            let _ = hostcalls::increment_metric(id, 1);
        }
        // kube-apiserver answers such a certificate with 401 as well. The same reply (and marker
        // header) as the filter's other own 401s: a client can tell the gate's answer from the
        // apiserver's.
        let reply = LocalReply::unauthorized("the client certificate is not an allowed front proxy");
        let headers: Vec<(&str, &str)> = reply.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if let Err(e) = hostcalls::send_http_response(reply.status, headers, Some(&reply.body)) {
            log::error!("kube-peer-proxy: cannot send local reply: {e:?}");
        }
        Action::Pause
    }
}
