//! The HTTP filter: strips client routing headers, asks [`routing::decide`], and acts on the
//! answer: continue to the local server, reroute to a peer, answer 503, or let the local server
//! answer a discovery request and swap its 200 for the merged document. The serving table lives in
//! a per-VM cache that is refreshed only when the small generation key in shared data changes.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

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
    /// Set when the local server's discovery answer is to be replaced by a merged document.
    merged: Option<MergedReply>,
}

/// A merged discovery answer waiting for the local apiserver's verdict: the local server
/// authenticates and authorizes the request as usual, and only its 200 is replaced.
struct MergedReply {
    doc: MergedDoc,
    table: Rc<Table>,
    if_none_match: Option<String>,
    /// Headers were rewritten; the local body is being swapped for `body`.
    body: Option<Rc<Vec<u8>>>,
}

impl PeerProxy {
    pub fn new(shared: Rc<Shared>) -> PeerProxy {
        PeerProxy {
            shared,
            rerouted: None,
            merged: None,
        }
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

    /// Response headers of a merged discovery request: on the local server's 200, becomes the
    /// merged document's headers (or a 304 when the client already has it).
    fn merged_response_headers(&mut self) {
        let Some(m) = self.merged.as_mut() else { return };
        let resp = MapType::HttpResponseHeaders;
        if host::header(resp, ":status").as_deref() != Some("200") {
            // 401, 403, 406, ...: the local server's verdict stands.
            self.merged = None;
            return;
        }
        let (etag, label, content_type) = match m.doc {
            MergedDoc::Apis => (m.table.apis_etag.clone(), "apis", CONTENT_TYPE_V2),
            MergedDoc::Api => (m.table.api_etag.clone(), "api", CONTENT_TYPE_V2),
            MergedDoc::ApisLegacy => (m.table.apis_legacy_etag.clone(), "apis_legacy", "application/json"),
        };
        let not_modified = m.if_none_match.as_deref() == Some(etag.as_str());
        m.body = Some(if not_modified {
            Rc::new(Vec::new())
        } else {
            self.shared.merged(m.doc)
        });
        host::set_header(resp, "content-length", None);
        host::set_header(resp, "content-type", Some(content_type));
        host::set_header(resp, "etag", Some(&etag));
        host::set_header(resp, "vary", Some("Accept"));
        host::set_header(resp, "cache-control", Some("public"));
        let code = if not_modified {
            host::set_header(resp, ":status", Some("304"));
            "304"
        } else {
            "200"
        };
        self.inc(metrics::name(
            metrics::MERGED_RESPONSES,
            &[("doc", label), ("code", code)],
        ));
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
            Decision::Merged(doc) => {
                if let Some(table) = table {
                    // The local server must answer in full (not 304 on its own ETag).
                    let if_none_match = host::header(req, "if-none-match");
                    if if_none_match.is_some() {
                        host::set_header(req, "if-none-match", None);
                    }
                    self.merged = Some(MergedReply {
                        doc,
                        table,
                        if_none_match,
                        body: None,
                    });
                }
                Action::Continue
            }
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

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(body) = self.merged.as_ref().and_then(|m| m.body.clone()) else {
            return Action::Continue;
        };
        // Drop the local document chunk by chunk (nothing is buffered), then send ours.
        let replacement: &[u8] = if end_of_stream { &body } else { &[] };
        if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, replacement) {
            log::error!("kube-peer-proxy: cannot replace the discovery body: {e:?}");
        }
        if end_of_stream {
            self.merged = None;
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.merged_response_headers();
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
