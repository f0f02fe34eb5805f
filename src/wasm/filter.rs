//! The HTTP filter: strips client routing headers, asks [`routing::decide`], and acts on the
//! answer: continue to the local server, reroute to a peer, answer 503, or let the local server
//! answer a discovery request and swap its 200 for the merged document. For guarded decisions it
//! carries out the 404 guard's steps (see [`crate::request::guard`]): the discovery calls it asks for, and
//! its verdict (the 404 stands, or becomes a 503).
//! The serving table lives in a per-VM cache: a request reads only the small generation key, and
//! the worker's timer decodes a new table before requests need it. The peers' passive-health
//! marks are read on the timer too (a request to a peer reads no shared data).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use super::host::{self, Metrics};
use crate::config::Config;
use crate::metrics;
use crate::passive_health::{self, Marks, Upstream};
use crate::request::guard::{Call, Conversation, Step, Target, Verdict};
use crate::request::identity;
use crate::request::readiness;
use crate::request::reply;
use crate::request::response;
use crate::request::routing::{self, Decision, Guard, Gvr, MergedDoc, RequestFacts};
use crate::snapshot::{self, Table};
use crate::PEER_PROXIED_HEADER;

/// Set on the 503s the filter answers itself, which already are `Status` documents, so Envoy's
/// local-reply mapper leaves them alone (see `python/kpp/render.py`).
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
    /// The passive-health marks of the table's servers (see [`passive_health`]).
    marks: Marks,
    /// The merged documents published whole (`None`: published in pieces, see
    /// [`snapshot::WHOLE_LIMIT`]), in [`response::merged_source`] order.
    docs: [Option<Rc<Vec<u8>>>; 3],
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

    /// The local server, as the table names it.
    fn local(&self) -> Target {
        Target {
            cluster: self.config.local_cluster.clone(),
            address: None,
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

    /// The table a request routes with. A request reads only the small generation key (about a
    /// microsecond, `make bench`'s probes) so a new snapshot, e.g. one that marks a member
    /// unreachable, is used from the next request on; the worker's timer usually has it decoded.
    pub fn table(&self) -> Option<Rc<Table>> {
        self.refresh()
    }

    /// The worker timer's work: the newest table (shared data is re-read only when the small
    /// generation key moved) and the passive-health marks of its servers.
    pub fn on_tick(&self) {
        self.cache.borrow_mut().marks.timer_runs();
        let table = self.refresh();
        self.cache
            .borrow_mut()
            .marks
            .load(table.as_deref(), &mut host::shared_u64);
    }

    fn is_down(&self, index: usize) -> bool {
        let cache = self.cache.borrow();
        cache
            .marks
            .is_down(index, cache.table.as_deref(), &mut host::shared_u64)
    }

    /// Marks a server down for every worker (shared data) and at once for this one.
    fn mark_down(&self, target: &str) {
        let value = passive_health::mark_value(host::now_ms());
        host::set_shared(&passive_health::down_key(target), value.as_bytes());
        let cache = &mut *self.cache.borrow_mut();
        cache.marks.mark(cache.table.as_deref(), target);
    }

    fn refresh(&self) -> Option<Rc<Table>> {
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
        // A whole document is copied into this VM; a chunked one is read piece by piece when a
        // request needs it. The documents must belong to this table; if the service is mid-write,
        // keep the previous snapshot and look again on the next request or tick.
        let doc = |doc: MergedDoc| -> Option<Option<Rc<Vec<u8>>>> {
            let (key, index) = response::merged_source(doc);
            let len = table.merged_lengths.get(index).copied().unwrap_or(0);
            if snapshot::is_chunked(len) {
                return Some(None);
            }
            let whole = host::shared(key).and_then(|v| snapshot::untag(table.generation, v))?;
            Some(Some(Rc::new(whole)))
        };
        if let (Some(apis), Some(api), Some(legacy)) =
            (doc(MergedDoc::Apis), doc(MergedDoc::Api), doc(MergedDoc::ApisLegacy))
        {
            // A new snapshot usually follows a member's change of health (the service clears a
            // recovered member's mark before it publishes): read the marks with it.
            cache.marks.load(Some(&table), &mut host::shared_u64);
            cache.generation = Some(table.generation);
            cache.table = Some(Rc::new(table));
            cache.docs = [apis, api, legacy];
        }
        cache.table.clone()
    }

    /// The body of a merged answer for `table` (the cached one): this VM's copy, or where its
    /// pieces are.
    fn merged(&self, doc: MergedDoc, table: &Table) -> Body {
        let (key, index) = response::merged_source(doc);
        let cache = self.cache.borrow();
        match cache.docs.get(index).cloned().flatten() {
            Some(whole) => Body::Whole(whole),
            None => Body::Pieces {
                key,
                generation: table.generation,
                len: table.merged_lengths.get(index).copied().unwrap_or(0),
            },
        }
    }
}

/// Removes every client copy of the request-header identity names and `X-Real-Ip` (Envoy's early
/// header mutation already did; this holds even if the bootstrap does not), then asserts the identity of a verified
/// client certificate as kube-apiserver's x509 authenticator would see it (see [`identity`]).
/// Envoy verified the certificate (chain, expiry, client-auth purpose) or refused the handshake.
fn assert_client_identity(names: &identity::RequestHeaderNames) -> Result<(), String> {
    let req = MapType::HttpRequestHeaders;
    for (name, _) in host::headers(req) {
        if names.is_stripped(&name) {
            host::set_header(req, &name, None);
        }
    }
    let Some(subject) = host::property(&["connection", "subject_peer_certificate"]).filter(|s| !s.is_empty()) else {
        return Ok(());
    };
    let Some(id) =
        identity::from_subject(&subject).map_err(|e| format!("client certificate subject {subject:?}: {e}"))?
    else {
        // No CN: kube-apiserver would not authenticate this certificate either.
        return Ok(());
    };
    for (name, value) in names.assert(&id)? {
        if !host::add_header(req, &name, &value) {
            return Err(format!("cannot add header {name}"));
        }
    }
    Ok(())
}

pub struct PeerProxy {
    shared: Rc<Shared>,
    /// Set when this request was sent to a peer: what for, and which target (cluster or address).
    rerouted: Option<(Gvr, String)>,
    /// Set when the local server's discovery answer is to be replaced by a merged document.
    merged: Option<MergedReply>,
    /// Set for requests a 404 guard applies to: what it asks about, and the server that answers.
    guard: Option<(Guard, Target)>,
    /// A 404 waiting for discovery answers.
    asking: Option<Asking>,
}

/// A 404's conversation (see [`crate::request::guard`]) and the host's token of each call it made.
struct Asking {
    conversation: Conversation,
    tokens: Vec<(u32, usize)>,
}

/// A merged discovery answer waiting for the local apiserver's verdict: the local server
/// authenticates and authorizes the request as usual, and only its 200 is replaced.
struct MergedReply {
    doc: MergedDoc,
    table: Rc<Table>,
    /// The document of `table`'s generation, taken with it: the VM may load a newer snapshot
    /// before the local server answers, and the body must match the ETag sent.
    source: Body,
    if_none_match: Option<String>,
    /// Headers were rewritten; the local body is being swapped for `body`.
    body: Option<Body>,
}

/// A merged answer's body: the VM's copy, or a document published in pieces, copied into the
/// response one piece at a time (see [`snapshot::WHOLE_LIMIT`]).
#[derive(Clone)]
enum Body {
    Whole(Rc<Vec<u8>>),
    Pieces {
        key: &'static str,
        generation: u64,
        len: u64,
    },
}

impl Body {
    /// Replaces the response body (`size` bytes of the local answer's last chunk) with this one.
    fn write(&self, size: usize) {
        let (key, generation, len) = match self {
            Body::Whole(doc) => {
                if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, size, doc) {
                    log::error!("kube-peer-proxy: cannot replace the discovery body: {e:?}");
                }
                return;
            }
            Body::Pieces { key, generation, len } => (*key, *generation, *len),
        };
        let mut written = 0usize;
        for i in 0..snapshot::chunk_count(len) {
            let piece =
                host::shared(&snapshot::chunk_key(key, generation, i)).and_then(|v| snapshot::untag(generation, v));
            let Some(piece) = piece else {
                // Only if two newer snapshots were published while this loop ran (each takes a
                // discovery round): the body stays short, and the client's JSON decoder says so.
                log::error!(
                    "kube-peer-proxy: piece {i} of {key} generation {generation} is gone; the answer is cut short"
                );
                return;
            };
            // The first piece replaces the local chunk; the next ones are appended.
            let (start, drop) = if i == 0 { (0, size) } else { (written, 0) };
            if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, start, drop, &piece) {
                log::error!("kube-peer-proxy: cannot write the discovery body: {e:?}");
                return;
            }
            written += piece.len();
        }
    }
}

impl PeerProxy {
    pub fn new(shared: Rc<Shared>) -> PeerProxy {
        PeerProxy {
            shared,
            rerouted: None,
            merged: None,
            guard: None,
            asking: None,
        }
    }

    /// Response headers of a guarded request: a 404 is judged, from its headers when they settle
    /// it, else while the headers wait for discovery answers (see [`crate::request::guard`]).
    fn guard_response_headers(&mut self, status: &str) -> Action {
        let Some((guard, target)) = self.guard.take().filter(|_| status == "404") else {
            return Action::Continue;
        };
        let table = self.shared.table();
        let content_type = host::header(MapType::HttpResponseHeaders, "content-type").unwrap_or_default();
        let (conversation, step) = Conversation::start(&guard, target, &content_type, table.as_deref());
        let tokens = Vec::new();
        self.asking = Some(Asking { conversation, tokens });
        match self.carry_out(step, table.as_deref()) {
            Some(Verdict::Stand) => Action::Continue,
            Some(Verdict::Unavailable) => Action::Pause,
            None => {
                log::debug!(
                    "kube-peer-proxy: a 404 for {:?} waits for discovery answers",
                    guard.subject.gvr
                );
                Action::Pause
            }
        }
    }

    /// Carries out the guard's steps until it waits (`None`) or has a verdict, which ends the
    /// conversation (a 503 is sent here). A call that cannot be made is answered at once, with no
    /// answer.
    fn carry_out(&mut self, mut step: Step, table: Option<&Table>) -> Option<Verdict> {
        let mut unasked = Vec::new();
        loop {
            match step {
                Step::Ask(calls) => {
                    for call in calls {
                        match (self.ask(&call), self.asking.as_mut()) {
                            (Some(token), Some(a)) => a.tokens.push((token, call.id)),
                            _ => unasked.push(call.id),
                        }
                    }
                }
                Step::Wait => {}
                Step::Verdict(verdict) => {
                    let asking = self.asking.take();
                    if let (Verdict::Unavailable, Some(a)) = (verdict, asking) {
                        let _ = self.guarded_503(&a.conversation.question().gvr);
                    }
                    return Some(verdict);
                }
            }
            let id = unasked.pop()?;
            step = self.asking.as_mut()?.conversation.on_answer(id, 0, &[], table);
        }
    }

    /// Makes one discovery call for the guard; `None` if it cannot be made.
    fn ask(&self, call: &Call) -> Option<u32> {
        let config = &self.shared.config;
        let cluster = &call.target.cluster;
        match hostcalls::dispatch_http_call(cluster, call.headers(config), None, vec![], config.fetch_timeout) {
            Ok(token) => Some(token),
            Err(e) => {
                log::warn!("kube-peer-proxy: cannot ask {cluster} about a 404: {e:?}");
                None
            }
        }
    }

    /// A 404 that might be false: 503 with Retry-After. The apiserver's `Audit-Id` goes along, so the
    /// client's 503 and the apiserver's audit event of that 404 can be matched.
    fn guarded_503(&mut self, gvr: &Gvr) -> Action {
        log::info!("kube-peer-proxy: a 404 for {gvr:?} might be false; answering 503");
        let body = reply::guarded_not_found(gvr, self.shared.config.retry_after_seconds);
        let audit_id = host::header(MapType::HttpResponseHeaders, "audit-id");
        self.service_unavailable("guarded_not_found", gvr, body, audit_id.as_deref())
    }

    fn inc(&self, base: &str, labels: &[(&str, &str)]) {
        self.shared.metrics.borrow_mut().inc_labelled(base, labels);
    }

    /// 503 Status with Retry-After, counted as a peer proxy error of `kind`; `audit_id`: the
    /// apiserver's, when this answers in place of its response.
    fn service_unavailable(&self, kind: &str, gvr: &Gvr, body: Vec<u8>, audit_id: Option<&str>) -> Action {
        let labels = [
            ("type", kind),
            ("group", gvr.group.as_str()),
            ("version", gvr.version.as_str()),
            ("resource", gvr.resource.as_str()),
        ];
        self.inc(metrics::PROXY_ERRORS, &labels);
        let retry = self.shared.config.retry_after_seconds.to_string();
        let mut headers = vec![
            ("content-type", "application/json"),
            ("retry-after", retry.as_str()),
            (FILTER_REPLY_HEADER, "true"),
        ];
        if let Some(id) = audit_id {
            headers.push(("audit-id", id));
        }
        self.reply(503, headers, Some(&body))
    }

    /// A load balancer's readiness check before the first snapshot (see [`readiness`]).
    fn not_ready(&self, body: &[u8]) -> Action {
        let headers = vec![
            ("content-type", "text/plain; charset=utf-8"),
            ("cache-control", "no-cache, private"),
            (FILTER_REPLY_HEADER, "true"),
        ];
        self.reply(503, headers, Some(body))
    }

    fn reply(&self, status: u32, headers: Vec<(&str, &str)>, body: Option<&[u8]>) -> Action {
        if let Err(e) = hostcalls::send_http_response(status, headers, body) {
            log::error!("kube-peer-proxy: cannot send local reply: {e:?}");
        }
        Action::Pause
    }

    /// Response headers of a merged discovery request: on the local server's 200, becomes the
    /// merged document's headers (or a 304 when the client already has it).
    fn merged_response_headers(&mut self, status: &str) {
        let Some(m) = self.merged.as_mut() else { return };
        let resp = MapType::HttpResponseHeaders;
        let status = status.parse().unwrap_or(0);
        let Some(h) = response::merged_headers(m.doc, &m.table, m.if_none_match.as_deref(), status) else {
            // 401, 403, 406, ...: the local server's verdict stands.
            self.merged = None;
            return;
        };
        m.body = Some(if h.status == 304 {
            Body::Whole(Rc::new(Vec::new()))
        } else {
            m.source.clone()
        });
        host::set_header(resp, "content-length", None);
        host::set_header(resp, "content-type", Some(h.content_type));
        host::set_header(resp, "etag", Some(&h.etag));
        host::set_header(resp, "vary", Some("Accept"));
        host::set_header(resp, "cache-control", Some("public"));
        let code = if h.status == 304 {
            host::set_header(resp, ":status", Some("304"));
            "304"
        } else {
            "200"
        };
        self.inc(metrics::MERGED_RESPONSES, &[("doc", h.label), ("code", code)]);
    }
}

impl Context for PeerProxy {
    /// A discovery answer about a waiting 404; the response resumes (or is replaced) once the
    /// last one is in.
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(tokens) = self.asking.as_mut().map(|a| &mut a.tokens) else {
            return;
        };
        let Some(id) = tokens
            .iter()
            .position(|(t, _)| *t == token)
            .map(|i| tokens.swap_remove(i).1)
        else {
            return;
        };
        let status = if num_headers == 0 {
            0
        } else {
            host::header(MapType::HttpCallResponseHeaders, ":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let body = host::buffer(BufferType::HttpCallResponseBody, body_size);
        let table = self.shared.table();
        let Some(asking) = self.asking.as_mut() else { return };
        let step = asking.conversation.on_answer(id, status, &body, table.as_deref());
        if self.carry_out(step, table.as_deref()) == Some(Verdict::Stand) {
            if let Err(e) = hostcalls::resume_http_response() {
                log::error!("kube-peer-proxy: cannot resume a response: {e:?}");
            }
        }
    }
}

impl HttpContext for PeerProxy {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Err(refused) = self.admit() {
            return refused;
        }
        let config = &self.shared.config;
        let req = MapType::HttpRequestHeaders;
        let method = host::header(req, ":method").unwrap_or_default();
        let path = host::header(req, ":path").unwrap_or_default();
        let accept = routing::needs_accept(&path)
            .then(|| host::header(req, "accept"))
            .flatten();
        let proxied = host::header(req, PEER_PROXIED_HEADER);
        let facts = RequestFacts {
            method: &method,
            path: &path,
            accept: accept.as_deref(),
            peer_proxied: proxied.as_deref(),
        };
        let table = self.shared.table();
        // A load balancer's readiness check before the first snapshot: not ready (see [`readiness`]).
        if let Some(body) = readiness::not_ready(&method, &path, table.is_some()) {
            log::debug!("kube-peer-proxy: {method} {path}: not ready, no discovery snapshot yet");
            return self.not_ready(&body);
        }
        let route = routing::route(
            &facts,
            table.as_deref(),
            config.merged_discovery,
            &mut |n| self.shared.pick(n),
            &mut |i| self.shared.is_down(i),
        );
        match route.decision {
            Decision::Local(reason) | Decision::Guarded { reason, .. } => {
                let mode = route.guard.as_ref().map(|g| g.mode);
                log::debug!("kube-peer-proxy: {method} {path} stays local ({reason:?}), 404 guard {mode:?}");
                self.guard = route.guard.map(|g| (g, self.shared.local()));
                Action::Continue
            }
            Decision::Unavailable { gvr } => {
                let body = reply::peer_unavailable(&gvr, config.retry_after_seconds);
                self.service_unavailable("peer_unavailable", &gvr, body, None)
            }
            Decision::Merged(doc) => {
                if let Some(table) = table {
                    self.merge(doc, table);
                }
                Action::Continue
            }
            Decision::Peer { index, gvr } => {
                if let Some(server) = table.as_ref().and_then(|t| t.servers.get(index)) {
                    log::debug!(
                        "kube-peer-proxy: {method} {path} -> peer {} ({})",
                        server.name,
                        server.cluster
                    );
                    self.reroute(server, gvr, route.guard);
                }
                Action::Continue
            }
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(body) = self.merged.as_ref().and_then(|m| m.body.clone()) else {
            return Action::Continue;
        };
        // Drop the local document chunk by chunk (nothing is buffered), then send ours.
        if !end_of_stream {
            if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &[]) {
                log::error!("kube-peer-proxy: cannot drop the local discovery body: {e:?}");
            }
            return Action::Continue;
        }
        body.write(body_size);
        self.merged = None;
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.merged.is_none() && self.rerouted.is_none() && self.guard.is_none() {
            return Action::Continue;
        }
        // One read of the status for all three (a host call costs about a microsecond).
        let status = host::header(MapType::HttpResponseHeaders, ":status").unwrap_or_default();
        self.merged_response_headers(&status);
        self.rerouted_response_headers(&status);
        self.guard_response_headers(&status)
    }
}

impl PeerProxy {
    /// Strips the client's routing and address headers (only this filter may choose a cluster or
    /// an address) and, with `client_identity`, asserts the client certificate's identity; `Err`:
    /// the 401 sent instead.
    fn admit(&self) -> Result<(), Action> {
        let config = &self.shared.config;
        let req = MapType::HttpRequestHeaders;
        let address_header = config.lease_discovery.as_ref().map(|l| l.address_header.as_str());
        for name in std::iter::once(config.route_header.as_str()).chain(address_header) {
            if host::header(req, name).is_some() {
                host::set_header(req, name, None);
            }
        }
        let Some(names) = &config.client_identity else {
            return Ok(());
        };
        let Err(message) = assert_client_identity(names) else {
            return Ok(());
        };
        log::warn!("kube-peer-proxy: refusing a request: {message}");
        let body = reply::unauthorized(&message);
        let headers = vec![("content-type", "application/json"), (FILTER_REPLY_HEADER, "true")];
        Err(self.reply(401, headers, Some(&body)))
    }

    /// A merged discovery request: the local server answers first, and its 200 is replaced.
    fn merge(&mut self, doc: MergedDoc, table: Rc<Table>) {
        let req = MapType::HttpRequestHeaders;
        // The local server must answer in full (not 304 on its own ETag).
        let if_none_match = host::header(req, "if-none-match");
        if if_none_match.is_some() {
            host::set_header(req, "if-none-match", None);
        }
        let source = self.shared.merged(doc, &table);
        self.merged = Some(MergedReply {
            doc,
            table,
            source,
            if_none_match,
            body: None,
        });
    }

    /// Sends the request to `server`, its type-404 guarded by `guard`. A server this filter cannot
    /// address leaves the request to the local server, unguarded, as before any routing.
    fn reroute(&mut self, server: &snapshot::ServerRef, gvr: Gvr, guard: Option<Guard>) {
        let config = &self.shared.config;
        let req = MapType::HttpRequestHeaders;
        // Never emit a cluster name our own configuration does not know (Envoy would 503).
        if !config.clusters().any(|c| c == server.cluster) {
            log::error!("kube-peer-proxy: snapshot names unknown cluster {}", server.cluster);
            return;
        }
        if let Some(address) = &server.address {
            // Lease peers share one address-picked cluster: only addresses learned from
            // leases are ever written here.
            let Some(l) = &config.lease_discovery else { return };
            host::set_header(req, &l.address_header, Some(address));
        }
        host::set_header(req, &config.route_header, Some(&server.cluster));
        // Every request-header change through the ABI clears Envoy's route cache
        // (`source/extensions/common/wasm/context.cc`, `replaceHeaderMapValue`), so the
        // router re-picks the route by the header just set; no extra foreign call.
        host::set_header(req, PEER_PROXIED_HEADER, Some("true"));
        self.rerouted = Some((gvr, server.target().to_string()));
        let target = Target {
            cluster: server.cluster.clone(),
            address: server.address.clone(),
        };
        self.guard = guard.map(|g| (g, target));
    }

    fn rerouted_response_headers(&mut self, code: &str) {
        let Some((gvr, target)) = self.rerouted.take() else {
            return;
        };
        let labels = [
            ("code", code),
            ("group", gvr.group.as_str()),
            ("version", gvr.version.as_str()),
            ("resource", gvr.resource.as_str()),
        ];
        self.inc(metrics::REROUTED, &labels);
        // A reply Envoy made itself (connect failure, timeout) means the peer was not reached.
        // Envoy's own replies are 5xx, so an answer below 500 needs no property read.
        let upstream = if passive_health::maybe_envoy_reply(code) {
            passive_health::upstream(&host::property(&["response", "code_details"]).unwrap_or_default())
        } else {
            Upstream::Answered
        };
        if upstream == Upstream::ConnectFailure {
            // Stop sending requests to this peer until it answers discovery again.
            log::warn!("kube-peer-proxy: cannot connect to {target}; marking it down");
            self.shared.mark_down(&target);
        }
        if upstream != Upstream::Answered {
            let labels = [("type", "upstream_unreachable"), labels[1], labels[2], labels[3]];
            self.inc(metrics::PROXY_ERRORS, &labels);
            // Envoy's own reply, not the peer's 404: nothing to guard.
            self.guard = None;
        }
    }
}
