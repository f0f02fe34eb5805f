//! The HTTP filter: strips client routing headers, asks [`routing::decide`], and acts on the
//! answer: continue to the local server, reroute to a peer, answer 503, or let the local server
//! answer a discovery request and swap its 200 for the merged document. For guarded decisions it
//! reads a 404's body and turns a "type not served here" 404 into a 503 (see [`crate::not_found`]).
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
use crate::guard::{self, First, Verdict};
use crate::health;
use crate::identity;
use crate::metrics;
use crate::reply::{self, Upstream};
use crate::routing::{self, Decision, Gvr, LocalReason, MergedDoc, RequestFacts, PEER_PROXIED_HEADER};
use crate::snapshot::{self, Table};
use crate::status;

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
    /// Servers (table bits) some filter could not connect to lately (see [`snapshot::down_key`]).
    down: u64,
    /// Whether the timer runs; without it, requests read the passive-health marks themselves.
    timer: bool,
    /// The merged documents published whole (`None`: published in pieces, see
    /// [`snapshot::WHOLE_LIMIT`]), in [`reply::merged_source`] order.
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
        self.cache.borrow_mut().timer = true;
        let table = self.refresh();
        self.cache.borrow_mut().down = read_marks(table.as_deref());
    }

    fn is_down(&self, index: usize) -> bool {
        let bit = snapshot::bit(index);
        let cache = self.cache.borrow();
        if cache.timer {
            return cache.down & bit != 0;
        }
        let Some(server) = cache.table.as_ref().and_then(|t| t.servers.get(index)) else {
            return false;
        };
        host::shared_u64(&snapshot::down_key(server.target())).is_some_and(|t| t != 0)
    }

    /// Marks a server down for every worker (shared data) and at once for this one.
    fn mark_down(&self, target: &str) {
        host::set_shared(&snapshot::down_key(target), host::now_ms().to_string().as_bytes());
        let mut cache = self.cache.borrow_mut();
        if let Some(i) = cache
            .table
            .as_ref()
            .and_then(|t| t.servers.iter().position(|s| s.target() == target))
        {
            cache.down |= snapshot::bit(i);
        }
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
            let (key, index) = reply::merged_source(doc);
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
            cache.down = read_marks(Some(&table));
            cache.generation = Some(table.generation);
            cache.table = Some(Rc::new(table));
            cache.docs = [apis, api, legacy];
        }
        cache.table.clone()
    }

    /// The body of a merged answer for `table` (the cached one): this VM's copy, or where its
    /// pieces are.
    fn merged(&self, doc: MergedDoc, table: &Table) -> Body {
        let (key, index) = reply::merged_source(doc);
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

/// The passive-health marks of `table`'s servers, as table bits (see [`snapshot::down_key`]).
fn read_marks(table: Option<&Table>) -> u64 {
    let mut down = 0u64;
    for (i, server) in table.iter().flat_map(|t| t.servers.iter()).enumerate() {
        if host::shared_u64(&snapshot::down_key(server.target())).is_some_and(|t| t != 0) {
            down |= snapshot::bit(i);
        }
    }
    down
}

pub struct PeerProxy {
    shared: Rc<Shared>,
    /// Set when this request was sent to a peer: what for, and which target (cluster or address).
    rerouted: Option<(Gvr, String)>,
    /// Set when the local server's discovery answer is to be replaced by a merged document.
    merged: Option<MergedReply>,
    /// Set for requests a 404 guard applies to: where the request went (see [`guard`]).
    guard: Option<Guard>,
    /// A 404 waiting for discovery answers.
    asking: Option<Asking>,
}

/// Where a request went, and the request itself (request headers cannot be read in the response
/// phase). `strict`: a "not served here" 404 is a 503 without asking other members.
struct Guard {
    strict: bool,
    cluster: String,
    address: Option<String>,
    method: String,
    path: String,
}

/// A 404 waiting for the answering server's and the other members' discovery.
struct Asking {
    question: guard::Question,
    /// The table says the answering server serves what the question asks about.
    last_seen: bool,
    strict: bool,
    /// The answering server's token, or its verdict already known from the 404's headers.
    answering: Result<Option<bool>, u32>,
    others: Vec<(u32, Option<bool>)>,
    pending: usize,
    /// The server that answered (not asked again as one of the others).
    answered_by: (String, Option<String>),
    others_asked: bool,
}

impl Asking {
    /// Verified mode asks the other members only once the answering server's own answer says
    /// "type not served" (an object's 404, the common case, costs one question).
    fn needs_others(&self) -> bool {
        let answer = match self.answering {
            Ok(a) => a.or(Some(self.last_seen).filter(|l| *l)),
            Err(_) => return false,
        };
        !self.strict && !self.others_asked && answer == Some(false)
    }
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

/// At most this many other members are asked about one 404; with more, the 404 is answered 503.
const MAX_ASKED: usize = 16;

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
    /// it, else while the headers wait for discovery answers (see [`guard`]).
    fn guard_response_headers(&mut self, status: &str) -> Action {
        let Some(g) = self.guard.take() else {
            return Action::Continue;
        };
        let resp = MapType::HttpResponseHeaders;
        if status != "404" {
            return Action::Continue;
        }
        let table = self.shared.table();
        let Some(question) = guard::question(&g.method, &g.path, table.as_deref()) else {
            return Action::Continue;
        };
        let content_type = host::header(resp, "content-type").unwrap_or_default();
        let answering = match guard::first_look(&content_type, &question) {
            First::TypeNotServed => Ok(Some(false)),
            First::AskServer => match self.ask(&question, &g.cluster, g.address.as_deref()) {
                Some(token) => Err(token),
                None => Ok(None),
            },
        };
        let last_seen = table.as_deref().is_some_and(|t| {
            let bit = t
                .servers
                .iter()
                .position(|s| s.cluster == g.cluster && s.address == g.address)
                .map_or(0, snapshot::bit);
            t.servers_for(&question.table_key()) & bit != 0
        });
        let mut asking = Asking {
            question,
            last_seen,
            strict: g.strict,
            answering,
            others: Vec::new(),
            pending: 0,
            answered_by: (g.cluster.clone(), g.address.clone()),
            others_asked: false,
        };
        if asking.needs_others() && !self.ask_others(&mut asking, table.as_deref()) {
            return self.guarded_503(&asking.question.gvr);
        }
        asking.pending += usize::from(asking.answering.is_err());
        if asking.pending == 0 {
            return self.conclude(asking);
        }
        log::debug!(
            "kube-peer-proxy: a 404 for {} waits for {} discovery answers",
            g.path,
            asking.pending
        );
        self.asking = Some(asking);
        Action::Pause
    }

    /// Nobody else is known to serve it: a 404 stands only if no other member serves it now.
    /// `false` when there are more members than may be asked about one 404.
    fn ask_others(&self, asking: &mut Asking, table: Option<&Table>) -> bool {
        asking.others_asked = true;
        let (cluster, address) = &asking.answered_by;
        let others: Vec<(String, Option<String>)> = table
            .iter()
            .flat_map(|t| t.servers.iter())
            .filter(|s| !(&s.cluster == cluster && &s.address == address))
            .map(|s| (s.cluster.clone(), s.address.clone()))
            .collect();
        if others.len() > MAX_ASKED {
            return false;
        }
        for (cluster, address) in others {
            if let Some(token) = self.ask(&asking.question, &cluster, address.as_deref()) {
                asking.others.push((token, None));
                asking.pending += 1;
            }
        }
        true
    }

    /// Asks one server's discovery about `q`; `None` if the call cannot be made.
    fn ask(&self, q: &guard::Question, cluster: &str, address: Option<&str>) -> Option<u32> {
        let config = &self.shared.config;
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "GET"),
            (":path", &q.path),
            (":authority", &config.discovery_authority),
            ("accept", "application/json"),
            (PEER_PROXIED_HEADER, "true"),
        ];
        headers.extend(config.discovery_headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let (Some(l), Some(a)) = (&config.lease_discovery, address) {
            headers.push((&l.address_header, a));
        }
        match hostcalls::dispatch_http_call(cluster, headers, None, vec![], config.fetch_timeout) {
            Ok(token) => Some(token),
            Err(e) => {
                log::warn!("kube-peer-proxy: cannot ask {cluster} about a 404: {e:?}");
                None
            }
        }
    }

    /// The verdict once every answer is in: the 404 stands, or becomes a 503.
    fn conclude(&mut self, asking: Asking) -> Action {
        let answering = asking.answering.unwrap_or(None);
        let others: Vec<Option<bool>> = asking.others.iter().map(|(_, v)| *v).collect();
        match guard::verdict(answering, asking.last_seen, asking.strict, &others) {
            Verdict::Stand => Action::Continue,
            Verdict::Unavailable => self.guarded_503(&asking.question.gvr),
        }
    }

    /// A 404 that might be false: 503 with Retry-After. The apiserver's `Audit-Id` goes along, so the
    /// client's 503 and the apiserver's audit event of that 404 can be matched.
    fn guarded_503(&mut self, gvr: &Gvr) -> Action {
        log::info!("kube-peer-proxy: a 404 for {gvr:?} might be false; answering 503");
        let body = status::guarded_not_found(gvr, self.shared.config.retry_after_seconds);
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
        let Some(h) = reply::merged_headers(m.doc, &m.table, m.if_none_match.as_deref(), status) else {
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
        let Some(mut asking) = self.asking.take() else { return };
        let status = if num_headers == 0 {
            0
        } else {
            host::header(MapType::HttpCallResponseHeaders, ":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let body = host::buffer(BufferType::HttpCallResponseBody, body_size);
        let answer = guard::listed(&asking.question, status, &body);
        if asking.answering == Err(token) {
            asking.answering = Ok(answer);
        } else if let Some(slot) = asking.others.iter_mut().find(|(t, _)| *t == token) {
            slot.1 = answer;
        } else {
            self.asking = Some(asking);
            return;
        }
        asking.pending = asking.pending.saturating_sub(1);
        if asking.needs_others() {
            let table = self.shared.table();
            if !self.ask_others(&mut asking, table.as_deref()) {
                let _ = self.guarded_503(&asking.question.gvr);
                return;
            }
        }
        if asking.pending > 0 {
            self.asking = Some(asking);
            return;
        }
        if self.conclude(asking) == Action::Continue {
            if let Err(e) = hostcalls::resume_http_response() {
                log::error!("kube-peer-proxy: cannot resume a response: {e:?}");
            }
        }
    }
}

impl HttpContext for PeerProxy {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let config = &self.shared.config;
        let req = MapType::HttpRequestHeaders;
        // Only this filter may choose a cluster or an address.
        if host::header(req, &config.route_header).is_some() {
            host::set_header(req, &config.route_header, None);
        }
        if let Some(l) = &config.lease_discovery {
            if host::header(req, &l.address_header).is_some() {
                host::set_header(req, &l.address_header, None);
            }
        }
        if let Some(names) = &config.client_identity {
            if let Err(message) = assert_client_identity(names) {
                log::warn!("kube-peer-proxy: refusing a request: {message}");
                let body = status::unauthorized(&message);
                return self.reply(
                    401,
                    vec![("content-type", "application/json"), (FILTER_REPLY_HEADER, "true")],
                    Some(&body),
                );
            }
        }
        let method = host::header(req, ":method").unwrap_or_default();
        let path = host::header(req, ":path").unwrap_or_default();
        let accept = if routing::needs_accept(&path) {
            host::header(req, "accept")
        } else {
            None
        };
        let proxied = host::header(req, PEER_PROXIED_HEADER);
        let facts = RequestFacts {
            method: &method,
            path: &path,
            accept: accept.as_deref(),
            peer_proxied: proxied.as_deref(),
        };
        let table = self.shared.table();
        // A load balancer's readiness check before the first snapshot: not ready (see [`health`]).
        if let Some(body) = health::not_ready(&method, &path, table.is_some()) {
            log::debug!("kube-peer-proxy: {method} {path}: not ready, no discovery snapshot yet");
            return self.reply(
                503,
                vec![
                    ("content-type", "text/plain; charset=utf-8"),
                    ("cache-control", "no-cache, private"),
                    (FILTER_REPLY_HEADER, "true"),
                ],
                Some(&body),
            );
        }
        let decision = routing::decide_with(
            &facts,
            table.as_deref(),
            config.merged_discovery,
            &mut |n| self.shared.pick(n),
            &mut |i| self.shared.is_down(i),
        );
        match decision {
            Decision::Local(reason) => {
                log::debug!("kube-peer-proxy: {method} {path} stays local ({reason:?})");
                if matches!(reason, LocalReason::ServedLocally | LocalReason::NotServedAnywhere) {
                    // Its type-404 stands only if no other member serves the resource now.
                    self.guard = Some(Guard {
                        strict: false,
                        cluster: config.local_cluster.clone(),
                        address: None,
                        method,
                        path,
                    });
                }
                Action::Continue
            }
            Decision::Guarded { reason, .. } => {
                log::debug!("kube-peer-proxy: {method} {path} stays local ({reason:?}), 404 guarded");
                self.guard = Some(Guard {
                    strict: true,
                    cluster: config.local_cluster.clone(),
                    address: None,
                    method,
                    path,
                });
                Action::Continue
            }
            Decision::Unavailable { gvr } => {
                let body = status::peer_unavailable(&gvr, config.retry_after_seconds);
                self.service_unavailable("peer_unavailable", &gvr, body, None)
            }
            Decision::Merged(doc) => {
                if let Some(table) = table {
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
                if let Some(address) = &server.address {
                    // Lease peers share one address-picked cluster: only addresses learned from
                    // leases are ever written here.
                    let Some(l) = &config.lease_discovery else {
                        return Action::Continue;
                    };
                    host::set_header(req, &l.address_header, Some(address));
                }
                host::set_header(req, &config.route_header, Some(&server.cluster));
                // Every request-header change through the ABI clears Envoy's route cache
                // (`source/extensions/common/wasm/context.cc`, `replaceHeaderMapValue`), so the
                // router re-picks the route by the header just set; no extra foreign call.
                host::set_header(req, PEER_PROXIED_HEADER, Some("true"));
                self.rerouted = Some((gvr, server.target().to_string()));
                self.guard = Some(Guard {
                    strict: true,
                    cluster: server.cluster.clone(),
                    address: server.address.clone(),
                    method,
                    path,
                });
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
        let upstream = if reply::maybe_envoy_reply(code) {
            reply::upstream(&host::property(&["response", "code_details"]).unwrap_or_default())
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
