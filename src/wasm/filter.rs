//! The HTTP filter: carries out the request walk's steps (see [`crate::request`]) with host calls.
//! Request phase: the client's routing headers are stripped and its certificate's identity
//! asserted, a readiness check before the first snapshot is answered, [`routing::route`] decides,
//! and the decision is acted on: continue to the local server, reroute to a peer, answer 503, or
//! let the local server answer a discovery request whose 200 is swapped for the merged document.
//! Response phase: the merged document's headers and body, passive health for a rerouted request,
//! and the 404 guard (its calls are [`super::asking`]'s). The per-VM state is [`Shared`].

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};

use super::asking::{Asking, Progress};
use super::host::{self, Phase};
use super::merged::MergedReply;
use super::worker::Shared;
use crate::header_map;
use crate::metrics;
use crate::passive_health::{self, Upstream};
use crate::request::forward::{self, ToPeer};
use crate::request::guard::{Conversation, Target, Verdict};
use crate::request::identity::RequestHeaderNames;
use crate::request::readiness;
use crate::request::reply::{LocalReply, ProxyError};
use crate::request::request_info;
use crate::request::routing::{self, Decision, Guard, Gvr, LocalReason, Mode, RequestFacts, Route, Subject};
use crate::snapshot::{ServerRef, Table};
use crate::PEER_PROXIED_HEADER;

const REQUEST: MapType = MapType::HttpRequestHeaders;
const RESPONSE: MapType = MapType::HttpResponseHeaders;

/// One request's state. What only some requests need (a reroute, a merged answer, a 404 waiting
/// for answers) is boxed: every request creates and drops this.
pub struct PeerProxy {
    shared: Rc<Shared>,
    /// Set when this request was sent to a peer: what for, and which target (cluster or address).
    rerouted: Option<Box<(Gvr<'static>, String)>>,
    /// Set when the local server's discovery answer is to be replaced by a merged document.
    merged: Option<Box<MergedReply>>,
    /// Set for requests a 404 guard applies to: its mode, and the server that answers (`None`: the
    /// local one). What it asks about is parsed again from `path` on a 404 (rare), rather than every
    /// request copying its subject out of the path.
    guard: Option<(Mode, Option<Target>)>,
    /// A guarded request's `:path` (Envoy does not show a filter the request headers while it
    /// handles the response).
    path: String,
    /// A 404 waiting for discovery answers.
    asking: Option<Box<Asking>>,
}

impl PeerProxy {
    pub fn new(shared: Rc<Shared>) -> PeerProxy {
        PeerProxy {
            shared,
            rerouted: None,
            merged: None,
            guard: None,
            path: String::new(),
            asking: None,
        }
    }
}

impl Context for PeerProxy {
    /// A discovery answer about a waiting 404; the response resumes (or is replaced) once the
    /// last one is in.
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _trailers: usize) {
        let Some(asking) = self.asking.take().map(|a| *a) else {
            return;
        };
        match asking.on_answer(&self.shared, token, num_headers, body_size) {
            Progress::Waiting(asking) => self.asking = Some(Box::new(asking)),
            Progress::Done(Verdict::Stand) => {
                if let Err(e) = hostcalls::resume_http_response() {
                    log::error!("kube-peer-proxy: cannot resume a response: {e:?}");
                }
            }
            Progress::Done(Verdict::Unavailable) => {}
        }
    }
}

impl HttpContext for PeerProxy {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        host::mark(Phase::Start);
        let (path, proxied) = match self.admit() {
            Ok(read) => read,
            Err(refused) => return refused,
        };
        host::mark(Phase::HeadersRead);
        let table = self.shared.table();
        // The method matters only before the first snapshot (the readiness paths) and for `/api`
        // and `/apis` (merged discovery is for GETs): every other decision is the same for any
        // method and Accept (`tests/routing.rs`), so they are read only when the first decision
        // says the request is root discovery.
        let method = match table {
            None => host::header(REQUEST, ":method").unwrap_or_default(),
            Some(_) => String::new(),
        };
        if let Some(body) = readiness::not_ready(&method, &path, table.is_some()) {
            log::debug!("kube-peer-proxy: {method} {path}: not ready, no discovery snapshot yet");
            return self.shared.send(&LocalReply::not_ready(body), None);
        }
        host::mark(Phase::TableRead);
        let merged_discovery = self.shared.config.merged_discovery;
        let first = self.route(&method, &path, None, proxied.as_deref(), table.as_deref());
        host::mark(Phase::Routed);
        if !(merged_discovery && first.decision == Decision::Local(LocalReason::LocalDiscovery)) {
            let action = self.act(first, table, &method, &path);
            self.keep_path(path);
            host::mark(Phase::Acted);
            return action;
        }
        // `/api` or `/apis`: decided again with the method and Accept.
        let method = host::header(REQUEST, ":method").unwrap_or_default();
        let accept = host::header(REQUEST, "accept");
        let route = self.route(&method, &path, accept.as_deref(), proxied.as_deref(), table.as_deref());
        let action = self.act(route, table, &method, &path);
        self.keep_path(path);
        action
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.merged.is_none() && self.rerouted.is_none() && self.guard.is_none() {
            return Action::Continue;
        }
        // One read of the status for all three (a host call costs about a microsecond).
        let status = host::header(RESPONSE, ":status").unwrap_or_default();
        if self
            .merged
            .as_mut()
            .is_some_and(|m| !m.on_headers(&self.shared, &status))
        {
            self.merged = None;
        }
        self.rerouted_response_headers(&status);
        self.guard_response_headers(&status)
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self
            .merged
            .as_ref()
            .is_some_and(|m| m.on_body(body_size, end_of_stream))
        {
            self.merged = None;
        }
        Action::Continue
    }
}

impl PeerProxy {
    /// Strips the client's routing and address headers ([`forward::routing_headers`]) and, with
    /// `client_identity`, asserts the client certificate's identity; returns the request's `:path`
    /// and `x-kubernetes-peer-proxied`. `Err`: the 401 sent instead.
    ///
    /// With `client_identity` every header name is looked at anyway (client copies of identity
    /// headers go by prefix), so the whole map is read once and those two come out of it: a host
    /// call that returns data re-enters the VM to allocate, and costs several times one that finds
    /// nothing (`make bench`'s probes). Without it, the few headers needed are read one by one.
    fn admit(&self) -> Result<(String, Option<String>), Action> {
        let config = &self.shared.config;
        let (Some(names), Some(stripped)) = (&config.client_identity, &self.shared.stripped) else {
            for name in forward::routing_headers(config) {
                if host::header(REQUEST, name).is_some() {
                    host::set_header(REQUEST, name, None);
                }
            }
            host::mark(Phase::Admitted);
            let path = host::header(REQUEST, ":path").unwrap_or_default();
            return Ok((path, host::header(REQUEST, PEER_PROXIED_HEADER)));
        };
        let pairs = host::header_pairs(REQUEST);
        let (mut path, mut proxied) = (None, None);
        let mut found: Vec<String> = Vec::new();
        for (name, value) in header_map::pairs(&pairs) {
            if path.is_none() && name == b":path" {
                path = Some(text(value));
            } else if proxied.is_none() && name.eq_ignore_ascii_case(PEER_PROXIED_HEADER.as_bytes()) {
                proxied = Some(text(value));
            }
            if stripped.matches(name)
                || forward::routing_headers(config).any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
            {
                found.push(String::from_utf8_lossy(name).into_owned());
            }
        }
        for name in found {
            host::set_header(REQUEST, &name, None);
        }
        if let Err(message) = assert_client_identity(names) {
            log::warn!("kube-peer-proxy: refusing a request: {message}");
            return Err(self.shared.send(&LocalReply::unauthorized(&message), None));
        }
        host::mark(Phase::Admitted);
        Ok((path.unwrap_or_default(), proxied))
    }

    /// [`routing::route`] with this worker's picks and passive-health marks.
    fn route<'a>(
        &self,
        method: &'a str,
        path: &'a str,
        accept: Option<&'a str>,
        peer_proxied: Option<&'a str>,
        table: Option<&Table>,
    ) -> Route<'a> {
        let facts = RequestFacts {
            method,
            path,
            accept,
            peer_proxied,
        };
        let shared = &self.shared;
        routing::route(
            &facts,
            table,
            shared.config.merged_discovery,
            &mut |n| shared.pick(n),
            &mut |i| shared.is_down(i),
        )
    }

    /// A guarded request's path, for its subject on a 404 (moved, not copied).
    fn keep_path(&mut self, path: String) {
        if self.guard.is_some() {
            self.path = path;
        }
    }

    /// Carries out a routing decision.
    fn act(&mut self, route: Route, table: Option<Rc<Table>>, method: &str, path: &str) -> Action {
        match route.decision {
            Decision::Local(reason) | Decision::Guarded { reason, .. } => {
                let mode = route.guard.as_ref().map(|g| g.mode);
                log::debug!("kube-peer-proxy: {method} {path} stays local ({reason:?}), 404 guard {mode:?}");
                self.guard = mode.map(|m| (m, None));
                Action::Continue
            }
            Decision::Unavailable { gvr } => {
                let reply = LocalReply::peer_unavailable(&gvr, self.shared.config.retry_after_seconds);
                self.shared.send(&reply, Some(&gvr))
            }
            Decision::Merged(doc) => {
                self.merged = table.map(|table| Box::new(MergedReply::start(&self.shared, doc, table)));
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

    /// Sends the request to `server`, its type-404 guarded by `guard` (see [`forward::to_peer`]).
    fn reroute(&mut self, server: &ServerRef, gvr: Gvr, guard: Option<Guard>) {
        let gvr = gvr.into_owned();
        match forward::to_peer(&self.shared.config, server) {
            ToPeer::Headers(headers) => {
                for (name, value) in headers {
                    host::set_header(REQUEST, name, Some(value));
                }
            }
            ToPeer::UnknownCluster => {
                log::error!("kube-peer-proxy: snapshot names unknown cluster {}", server.cluster);
                return;
            }
            ToPeer::NoAddressHeader => return,
        }
        self.rerouted = Some(Box::new((gvr, server.target().to_string())));
        let target = Target {
            cluster: server.cluster.clone(),
            address: server.address.clone(),
        };
        self.guard = guard.map(|g| (g.mode, Some(target)));
    }

    /// A rerouted request's answer: counted, and Envoy's own reply for a connect failure marks the
    /// peer down (see [`passive_health`]). Counted at the answer's headers, not at the stream's end:
    /// a watch counts when it starts, while Envoy writes its access-log line when it ends, so the two
    /// agree only at a cut with no stream open (`tests/e2e/test_metric_crosscheck.py`).
    fn rerouted_response_headers(&mut self, code: &str) {
        let Some((gvr, target)) = self.rerouted.take().map(|r| *r) else {
            return;
        };
        let labels = [
            ("code", code),
            ("group", &*gvr.group),
            ("version", &*gvr.version),
            ("resource", &*gvr.resource),
        ];
        self.shared.inc(metrics::REROUTED, &labels);
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
            self.shared
                .inc(metrics::PROXY_ERRORS, &ProxyError::UpstreamUnreachable.labels(&gvr));
            // Envoy's own reply, not the peer's 404: nothing to guard.
            self.guard = None;
        }
    }

    /// A guarded request's 404 is judged, from its headers when they settle it, else while the
    /// headers wait for discovery answers (see [`crate::request::guard`]).
    fn guard_response_headers(&mut self, status: &str) -> Action {
        let Some((mode, target)) = self.guard.take().filter(|_| status == "404") else {
            return Action::Continue;
        };
        // The subject depends on the path alone (not on the method: `tests/routing.rs`).
        let path = std::mem::take(&mut self.path);
        let mut decoded = String::new();
        let kind = request_info::parse_decoded("", &path, &mut decoded);
        let Some(subject) = Subject::of(&kind) else {
            return Action::Continue;
        };
        let guard = Guard { mode, subject };
        let target = target.unwrap_or_else(|| self.shared.local());
        let table = self.shared.table();
        let content_type = host::header(RESPONSE, "content-type").unwrap_or_default();
        let (conversation, step) = Conversation::start(&guard, target, &content_type, table.as_deref());
        match Asking::start(&self.shared, conversation, step, table.as_deref()) {
            Progress::Done(Verdict::Stand) => Action::Continue,
            Progress::Done(Verdict::Unavailable) => Action::Pause,
            Progress::Waiting(asking) => {
                log::debug!(
                    "kube-peer-proxy: a 404 for {:?} waits for discovery answers",
                    guard.subject.gvr
                );
                self.asking = Some(Box::new(asking));
                Action::Pause
            }
        }
    }
}

/// A header value as text, as [`host::header`] gives it (invalid UTF-8 replaced).
fn text(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}

/// Asserts the identity of a verified client certificate as kube-apiserver's x509 authenticator
/// would see it ([`RequestHeaderNames::assertion`]), once every client copy of the request-header
/// identity names and `X-Real-Ip` is gone ([`PeerProxy::admit`]; Envoy's early header mutation
/// already removed them, this holds even if the bootstrap does not). Envoy verified the
/// certificate (chain, expiry, client-auth purpose) or refused the handshake.
fn assert_client_identity(names: &RequestHeaderNames) -> Result<(), String> {
    let subject = host::property(&["connection", "subject_peer_certificate"]);
    for (name, value) in names.assertion(subject.as_deref())? {
        if !host::add_header(REQUEST, &name, &value) {
            return Err(format!("cannot add header {name}"));
        }
    }
    Ok(())
}
