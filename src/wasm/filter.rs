//! The HTTP filter: strips client routing headers, asks [`routing::decide`], and acts on the
//! answer. The serving table lives in a per-VM cache that is refreshed only when the small
//! generation key in shared data changes.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};

use super::host::{self, Metrics};
use crate::config::Config;
use crate::discovery::CONTENT_TYPE_V2;
use crate::metrics;
use crate::routing::{self, Decision, Gvr, MergedDoc, RequestFacts, PEER_PROXIED_HEADER};
use crate::snapshot::{self, Table};
use crate::status;

/// Set on requests the filter answers with a 503 itself (see `envoy/render.py`).
const FILTER_REPLY_HEADER: &str = "x-kube-peer-proxy-reply";

/// Per-VM state shared by every request on this worker.
pub struct Shared {
    config: Config,
    cache: RefCell<Cache>,
    metrics: RefCell<Metrics>,
    rng: Cell<u64>,
}

#[derive(Default)]
struct Cache {
    generation: Option<u64>,
    table: Option<Rc<Table>>,
    apis: Rc<Vec<u8>>,
    api: Rc<Vec<u8>>,
    apis_legacy: Rc<Vec<u8>>,
}

impl Shared {
    pub fn new(config: Config, seed: u32) -> Shared {
        let seed = host::now_ms() ^ (u64::from(seed) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        Shared {
            config,
            cache: RefCell::new(Cache::default()),
            metrics: RefCell::new(Metrics::default()),
            rng: Cell::new(seed | 1),
        }
    }

    /// xorshift64*: uniform enough to spread requests over peers, no crate needed.
    fn pick(&self, n: usize) -> usize {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        usize::try_from(r % n.max(1) as u64).unwrap_or(0)
    }

    /// The newest table; re-reads shared data only when the generation moved. Called on the
    /// filter's timer too, so a new snapshot is usually loaded before a request needs it.
    pub fn table(&self) -> Option<Rc<Table>> {
        let generation = host::shared_u64(snapshot::KEY_GENERATION);
        let mut cache = self.cache.borrow_mut();
        if generation.is_none() || generation == cache.generation {
            return cache.table.clone();
        }
        let table = match host::shared(snapshot::KEY_TABLE).map(|b| Table::decode(&b)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                log::error!("kube-peer-proxy: undecodable snapshot table: {e}");
                return cache.table.clone();
            }
            None => return cache.table.clone(),
        };
        let doc = |key: &str| host::shared(key).and_then(|v| snapshot::untag(table.generation, v));
        // The documents must belong to this table; if the service is mid-write, keep the previous
        // snapshot and look again on the next request or tick.
        if let (Some(apis), Some(api), Some(legacy)) = (
            doc(snapshot::KEY_MERGED_APIS),
            doc(snapshot::KEY_MERGED_API),
            doc(snapshot::KEY_MERGED_APIS_LEGACY),
        ) {
            cache.generation = Some(table.generation);
            cache.table = Some(Rc::new(table));
            cache.apis = Rc::new(apis);
            cache.api = Rc::new(api);
            cache.apis_legacy = Rc::new(legacy);
        }
        cache.table.clone()
    }

    fn merged(&self, doc: MergedDoc) -> Rc<Vec<u8>> {
        let cache = self.cache.borrow();
        match doc {
            MergedDoc::Apis => cache.apis.clone(),
            MergedDoc::Api => cache.api.clone(),
            MergedDoc::ApisLegacy => cache.apis_legacy.clone(),
        }
    }
}

/// Whether a filter recently failed to connect to `servers[index]` (see [`snapshot::down_key`]).
fn is_marked_down(table: Option<&Table>, index: usize) -> bool {
    let Some(server) = table.and_then(|t| t.servers.get(index)) else {
        return false;
    };
    host::shared_u64(&snapshot::down_key(&server.cluster)).is_some_and(|t| t != 0)
}

pub struct PeerProxy {
    shared: Rc<Shared>,
    /// Set when this request was sent to a peer: what for, and which cluster.
    rerouted: Option<(Gvr, String)>,
}

impl PeerProxy {
    pub fn new(shared: Rc<Shared>) -> PeerProxy {
        PeerProxy { shared, rerouted: None }
    }

    fn inc(&self, name: String) {
        self.shared.metrics.borrow_mut().inc(name);
    }

    /// 503 Status with Retry-After, counted as a peer proxy error of `kind`.
    fn service_unavailable(&self, kind: &str, gvr: &Gvr, body: Vec<u8>) -> Action {
        let labels = [
            ("type", kind),
            ("group", gvr.group.as_str()),
            ("version", gvr.version.as_str()),
            ("resource", gvr.resource.as_str()),
        ];
        self.inc(metrics::name(metrics::PROXY_ERRORS, &labels));
        // Tells the bootstrap's local-reply mapper that this 503 already is a Status document.
        host::set_header(MapType::HttpRequestHeaders, FILTER_REPLY_HEADER, Some("true"));
        let retry = self.shared.config.retry_after_seconds.to_string();
        self.reply(
            503,
            vec![("content-type", "application/json"), ("retry-after", &retry)],
            Some(&body),
        )
    }

    fn reply(&self, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) -> Action {
        if let Err(e) = hostcalls::send_http_response(status, headers, body) {
            log::error!("kube-peer-proxy: cannot send local reply: {e:?}");
        }
        Action::Pause
    }

    fn serve_merged(&self, doc: MergedDoc, table: &Table) -> Action {
        let (etag, label, content_type) = match doc {
            MergedDoc::Apis => (table.apis_etag.as_str(), "apis", CONTENT_TYPE_V2),
            MergedDoc::Api => (table.api_etag.as_str(), "api", CONTENT_TYPE_V2),
            MergedDoc::ApisLegacy => (table.apis_legacy_etag.as_str(), "apis_legacy", "application/json"),
        };
        let common = [("etag", etag), ("vary", "Accept"), ("cache-control", "public")];
        if host::header(MapType::HttpRequestHeaders, "if-none-match").as_deref() == Some(etag) {
            self.inc(metrics::name(
                metrics::MERGED_RESPONSES,
                &[("doc", label), ("code", "304")],
            ));
            return self.reply(304, common.to_vec(), None);
        }
        self.inc(metrics::name(
            metrics::MERGED_RESPONSES,
            &[("doc", label), ("code", "200")],
        ));
        let body = self.shared.merged(doc);
        let mut headers = common.to_vec();
        headers.push(("content-type", content_type));
        self.reply(200, headers, Some(&body))
    }
}

impl Context for PeerProxy {}

impl HttpContext for PeerProxy {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let config = &self.shared.config;
        let req = MapType::HttpRequestHeaders;
        // Only this filter may choose a cluster.
        if host::header(req, &config.route_header).is_some() {
            host::set_header(req, &config.route_header, None);
        }
        let method = host::header(req, ":method").unwrap_or_default();
        let path = host::header(req, ":path").unwrap_or_default();
        let accept = host::header(req, "accept");
        let proxied = host::header(req, PEER_PROXIED_HEADER);
        let facts = RequestFacts {
            method: &method,
            path: &path,
            accept: accept.as_deref(),
            peer_proxied: proxied.as_deref(),
        };
        let table = self.shared.table();
        let decision = routing::decide_with(
            &facts,
            table.as_deref(),
            config.merged_discovery,
            &mut |n| self.shared.pick(n),
            &mut |i| is_marked_down(table.as_deref(), i),
        );
        match decision {
            Decision::Local(reason) => {
                log::debug!("kube-peer-proxy: {method} {path} stays local ({reason:?})");
                Action::Continue
            }
            Decision::Unavailable { gvr } => {
                let body = status::peer_unavailable(&gvr, config.retry_after_seconds);
                self.service_unavailable("peer_unavailable", &gvr, body)
            }
            Decision::NotReady => {
                let body = status::not_ready(config.retry_after_seconds);
                self.service_unavailable("not_ready", &Gvr::default(), body)
            }
            Decision::Merged(doc) => match table {
                Some(t) => self.serve_merged(doc, &t),
                None => Action::Continue,
            },
            Decision::Peer { index, gvr } => {
                let Some(server) = table.as_ref().and_then(|t| t.servers.get(index)) else {
                    return Action::Continue;
                };
                // Never emit a cluster name our own configuration does not know (Envoy would 503).
                if !config.clusters().any(|c| c == server.cluster) {
                    log::error!("kube-peer-proxy: snapshot names unknown cluster {}", server.cluster);
                    return Action::Continue;
                }
                log::debug!(
                    "kube-peer-proxy: {method} {path} -> peer {} ({})",
                    server.name,
                    server.cluster
                );
                host::set_header(req, &config.route_header, Some(&server.cluster));
                host::set_header(req, PEER_PROXIED_HEADER, Some("true"));
                // Envoy 1.40 already re-picks the route after a header change; this keeps newer
                // Envoys (which may stop doing so) correct and is harmless otherwise.
                let _ = hostcalls::call_foreign_function("clear_route_cache", None);
                self.rerouted = Some((gvr, server.cluster.clone()));
                Action::Continue
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some((gvr, cluster)) = self.rerouted.take() else {
            return Action::Continue;
        };
        let code = host::header(MapType::HttpResponseHeaders, ":status").unwrap_or_default();
        let labels = [
            ("code", code.as_str()),
            ("group", gvr.group.as_str()),
            ("version", gvr.version.as_str()),
            ("resource", gvr.resource.as_str()),
        ];
        self.inc(metrics::name(metrics::REROUTED, &labels));
        // A reply Envoy made itself (connect failure, timeout) means the peer was not reached.
        let details = host::property(&["response", "code_details"]).unwrap_or_default();
        if details.contains("connection_failure") {
            // Stop sending requests to this peer until it answers discovery again.
            log::warn!("kube-peer-proxy: cannot connect to cluster {cluster}; marking it down");
            host::set_shared(&snapshot::down_key(&cluster), host::now_ms().to_string().as_bytes());
        }
        if !details.is_empty() && details != "via_upstream" {
            let labels = [("type", "upstream_unreachable"), labels[1], labels[2], labels[3]];
            self.inc(metrics::name(metrics::PROXY_ERRORS, &labels));
        }
        Action::Continue
    }
}
