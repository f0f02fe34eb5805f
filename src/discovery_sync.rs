//! Discovery synchronisation for the local server and every peer (upstream's `local_discovery.go`
//! and `peer_discovery.go` in one state machine, with no host calls so it is tested natively).
//!
//! Each round fetches `/api` and `/apis` from every member with the `profile=nopeer` Accept list
//! and `x-kubernetes-peer-proxied: true`, reusing ETags so unchanged documents cost a 304. A server
//! that answers legacy discovery is walked through `/api/<v>` and `/apis/<g>/<v>`.
//!
//! Membership is separate from freshness: a member is every configured server, or in lease mode
//! every server whose identity lease is live. What a member was last seen to serve is kept however
//! old it gets (it is routed to only while fresh); `/api`, `/apis` and each legacy group/version
//! are learned separately, so a partial answer counts for what it did answer.

use std::collections::HashMap;
use std::rc::Rc;

use crate::config::{Config, LeaseDiscovery};
use crate::discovery::{self, GroupDiscovery, GroupMeta, VersionDiscovery};
use crate::leases::{self, LeasePeer};
use crate::routing::PEER_PROXIED_HEADER;
use crate::snapshot::{self, Member, ServerRef, Snapshot};

/// client-go `AcceptV2NoPeer`, then v2, v2beta1 (servers 1.26–1.29) and legacy JSON.
pub const DISCOVERY_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// A request the host adapter must dispatch and answer with [`Syncer::on_response`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub id: u64,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
}

impl Fetch {
    pub fn path(&self) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k == ":path")
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }
}

/// What came back for a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Response {
        status: u16,
        content_type: String,
        etag: Option<String>,
        body: Vec<u8>,
    },
    /// Envoy could not connect to the server (its own 503, not the server's): the only failure
    /// that marks a server unhealthy, i.e. not routed to while its data is kept.
    Unreachable,
    /// The stream ended without a usable response: reset mid-body, Envoy's own response-size
    /// limit, or a dispatch failure.
    NoResponse,
    /// No answer before the round's deadline.
    Overdue,
    /// The body exceeded `max_discovery_bytes` and was not read.
    Oversized,
}

/// Why a fetch failed; [`SyncErrorKind::label`] is the `type` label of
/// `discovery_sync_errors_total{type,server}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncErrorKind {
    /// Envoy could not connect: the only failure that marks a server unhealthy.
    Unreachable,
    /// The server answered 503.
    Unavailable,
    /// No answer in time (the round's deadline, or a 504).
    Timeout,
    /// The stream ended without a usable response.
    Reset,
    /// Any other unexpected status (401, 403, 500, a 304 without a cached document, ...).
    HttpStatus,
    /// The body is not the document its path should have.
    Decode,
    /// The body exceeded `max_discovery_bytes`.
    Oversized,
}

impl SyncErrorKind {
    pub fn label(self) -> &'static str {
        match self {
            SyncErrorKind::Unreachable => "unreachable",
            SyncErrorKind::Unavailable => "unavailable",
            SyncErrorKind::Timeout => "timeout",
            SyncErrorKind::Reset => "reset",
            SyncErrorKind::HttpStatus => "http_status",
            SyncErrorKind::Decode => "decode",
            SyncErrorKind::Oversized => "oversized",
        }
    }
}

/// A sync failure, counted by the adapter as `discovery_sync_errors_total{type,server}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncError {
    pub server: String,
    pub kind: SyncErrorKind,
    pub detail: String,
}

/// A snapshot ready to be written to shared data (see [`Snapshot`]).
pub type Publish = Snapshot;

/// Everything a callback produced.
#[derive(Debug, Default)]
pub struct Step {
    pub fetches: Vec<Fetch>,
    pub errors: Vec<SyncError>,
    pub publish: Option<Publish>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Purpose {
    ApiRoot,
    ApisRoot,
    /// Index into the core part's legacy walk.
    CoreVersion(usize),
    /// Index into the groups part's legacy walk.
    GroupVersion(usize),
    /// The identity lease list (lease mode; fetched from the local server).
    Leases,
}

/// A parsed document, cached with its ETag so a 304 can reuse it.
#[derive(Debug, Clone)]
enum Doc {
    /// An aggregated list, and the ETag it came with.
    Aggregated(Rc<Vec<GroupDiscovery>>, Option<String>),
    ApiVersions(Vec<String>),
    GroupList(Vec<(String, Vec<String>)>),
    ResourceList(VersionDiscovery),
    /// `/api` answered 404 (aggregated API servers have no core group).
    Absent,
    /// What the cache holds for an aggregated document: a 304 means "keep the server's current
    /// data", so the (large) parsed document is not kept twice or cloned.
    Unchanged,
}

/// What a round learned about one part (`/api` or `/apis`) of a server.
#[derive(Debug, Default)]
enum PartWork {
    /// No usable answer (yet): the part keeps what it had.
    #[default]
    Failed,
    /// 304: the part's data is current.
    Unchanged,
    Docs(Rc<Vec<GroupDiscovery>>, Option<String>),
    /// A legacy walk: `(group, version, resources if that fetch succeeded)`, in the server's order.
    Legacy(Vec<(String, String, Option<VersionDiscovery>)>),
}

#[derive(Debug, Default)]
struct Work {
    pending: usize,
    /// A fetch could not reach the server at all (as opposed to a bad answer).
    unreachable: bool,
    core: PartWork,
    groups: PartWork,
}

/// One part of a server's API set as last learned.
#[derive(Debug, Default, Clone)]
struct Part {
    /// `None` until learned once; then kept however old it gets. Shared (not copied) between
    /// servers that sent equal documents: during an upgrade most servers run the same version, and
    /// a large parsed document is the biggest thing the discovery service holds.
    docs: Option<Rc<Vec<GroupDiscovery>>>,
    /// The ETag `docs` came with (aggregated discovery only): another server answering the same
    /// ETag sent the same document, which is then shared without being parsed again.
    etag: Option<String>,
    /// Group/versions listed by a legacy walk whose resources were never learned.
    unknown: Vec<(String, String)>,
    last_ms: Option<u64>,
}

impl Part {
    fn fresh(&self, now_ms: u64, staleness_ms: u64) -> bool {
        self.docs.is_some() && self.last_ms.is_some_and(|t| now_ms.saturating_sub(t) <= staleness_ms)
    }
}

#[derive(Debug)]
struct Server {
    reference: ServerRef,
    /// The identity lease that makes it a member (lease mode peers only).
    lease: Option<LeasePeer>,
    core: Part,
    groups: Part,
    /// Whether the server answered its last finished round (even with an unusable document).
    reachable: bool,
    cache: HashMap<String, (String, Doc)>,
    work: Work,
    /// Its lease is gone: leaves when the round ends (in-flight fetches still name it).
    leaving: bool,
    /// It restarted while fetches to it were in flight: their answers may predate the restart, so
    /// they are discarded and the server is asked again.
    refetch: bool,
}

impl Server {
    fn new(reference: ServerRef, lease: Option<LeasePeer>) -> Server {
        Server {
            reference,
            lease,
            core: Part::default(),
            groups: Part::default(),
            reachable: true,
            cache: HashMap::new(),
            work: Work::default(),
            leaving: false,
            refetch: false,
        }
    }

    /// Whether discovery can be fetched at all (a lease peer without an address cannot).
    fn fetchable(&self) -> bool {
        self.lease.is_none() || self.reference.address.is_some()
    }
}

/// A fetch waiting for its answer.
#[derive(Debug)]
struct InFlight {
    /// Index into `servers` (stable within a round: servers leave only when it ends).
    server: usize,
    purpose: Purpose,
    path: String,
}

/// What the built snapshot depends on besides the documents: per member its name, whether each
/// part is known and fresh, and whether it is reachable.
type BuildInputs = (bool, Vec<(String, bool, bool, bool, bool, bool)>);

pub struct Syncer {
    servers: Vec<Server>,
    authority: String,
    extra_headers: Vec<(String, String)>,
    refresh_ms: u64,
    fetch_timeout_ms: u64,
    staleness_ms: u64,
    max_bytes: usize,
    next_id: u64,
    in_flight: HashMap<u64, InFlight>,
    round_deadline_ms: Option<u64>,
    next_round_ms: u64,
    generation: u64,
    published: Option<Vec<u8>>,
    round_completed_ms: Option<u64>,
    /// Some server's data or membership changed since the last build.
    dirty: bool,
    /// How many times a snapshot was built (merged, encoded, compared): unchanged rounds must not.
    builds: u64,
    last_built: Option<BuildInputs>,
    leases: Option<LeaseDiscovery>,
    /// Lease mode: whether a lease list has ever been read (before that, membership is unknown).
    leases_listed: bool,
}

impl Syncer {
    pub fn new(c: &Config) -> Syncer {
        let mut servers = vec![ServerRef {
            name: c.local_name.clone(),
            cluster: c.local_cluster.clone(),
            local: true,
            address: None,
        }];
        servers.extend(c.peers.iter().map(|p| ServerRef {
            name: p.name.clone(),
            cluster: p.cluster.clone(),
            local: false,
            address: None,
        }));
        Syncer {
            servers: servers.into_iter().map(|r| Server::new(r, None)).collect(),
            authority: c.discovery_authority.clone(),
            extra_headers: c.discovery_headers.clone(),
            refresh_ms: millis(c.refresh_interval),
            fetch_timeout_ms: millis(c.fetch_timeout),
            staleness_ms: millis(c.staleness_limit),
            max_bytes: c.max_discovery_bytes,
            next_id: 1,
            in_flight: HashMap::new(),
            round_deadline_ms: None,
            next_round_ms: 0,
            generation: 0,
            published: None,
            round_completed_ms: None,
            dirty: true,
            builds: 0,
            last_built: None,
            leases: c.lease_discovery.clone(),
            leases_listed: false,
        }
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub fn fetch_timeout_ms(&self) -> u64 {
        self.fetch_timeout_ms
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Snapshots built so far (each costs a merge and an encode, published or not).
    pub fn builds(&self) -> u64 {
        self.builds
    }

    /// When the last round finished (published or unchanged): the snapshot's age is measured from it.
    pub fn round_completed_ms(&self) -> Option<u64> {
        self.round_completed_ms
    }

    /// Per-member `(name, last full success ms)` for metrics: the older of its two parts' last
    /// success, `None` while either part was never learned.
    pub fn server_status(&self) -> impl Iterator<Item = (&str, Option<u64>)> {
        self.servers.iter().map(|s| {
            let last = match (s.core.last_ms, s.groups.last_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                _ => None,
            };
            (s.reference.name.as_str(), last)
        })
    }

    /// Per-member `(name, both parts fresh at now_ms)`: the one definition of freshness, used by
    /// the table and the `server_fresh` gauge alike.
    pub fn server_freshness(&self, now_ms: u64) -> impl Iterator<Item = (&str, bool)> {
        let staleness = self.staleness_ms;
        self.servers.iter().map(move |s| {
            let fresh = s.core.fresh(now_ms, staleness) && s.groups.fresh(now_ms, staleness);
            (s.reference.name.as_str(), fresh)
        })
    }

    /// `(target, last answer ms)` of servers that answered their last round: a passive "down"
    /// mark older than that answer is obsolete.
    pub fn answering_clusters(&self) -> impl Iterator<Item = (&str, u64)> {
        self.servers.iter().filter(|s| s.reachable).filter_map(|s| {
            let last = s.core.last_ms.max(s.groups.last_ms)?;
            Some((s.reference.target(), last))
        })
    }

    /// Called on every timer tick: starts a round when one is due, and ends a round whose
    /// answers are overdue (the host normally enforces the per-fetch timeout itself).
    pub fn on_tick(&mut self, now_ms: u64) -> Step {
        let mut step = Step::default();
        if let Some(deadline) = self.round_deadline_ms {
            if now_ms < deadline {
                return step;
            }
            let overdue: Vec<u64> = self.in_flight.keys().copied().collect();
            for id in overdue {
                let more = self.on_response(id, Outcome::Overdue, now_ms);
                step.errors.extend(more.errors);
                step.publish = step.publish.or(more.publish);
            }
            self.in_flight.clear();
            self.round_deadline_ms = None;
        }
        if now_ms < self.next_round_ms {
            return step;
        }
        self.next_round_ms = now_ms.saturating_add(self.refresh_ms);
        // Legacy servers (and new lease members) need a second phase of fetches, hence room for
        // two timeouts and slack.
        self.round_deadline_ms =
            Some(now_ms.saturating_add(self.fetch_timeout_ms.saturating_mul(2).saturating_add(500)));
        self.expire_leases(now_ms);
        if self.leases.is_some() {
            let local = self.servers.iter().position(|s| s.reference.local).unwrap_or(0);
            step.fetches
                .push(self.fetch(local, leases::LEASE_LIST_PATH.to_string(), Purpose::Leases));
        }
        for i in 0..self.servers.len() {
            self.start_server(i, &mut step);
        }
        step
    }

    fn start_server(&mut self, i: usize, step: &mut Step) {
        let Some(s) = self.servers.get_mut(i) else { return };
        if !s.fetchable() || s.leaving {
            return;
        }
        s.work = Work::default();
        step.fetches.push(self.fetch(i, "/api".to_string(), Purpose::ApiRoot));
        step.fetches.push(self.fetch(i, "/apis".to_string(), Purpose::ApisRoot));
    }

    fn fetch(&mut self, server: usize, path: String, purpose: Purpose) -> Fetch {
        let id = self.next_id;
        self.next_id += 1;
        let accept = if purpose == Purpose::Leases {
            "application/json"
        } else {
            DISCOVERY_ACCEPT
        };
        let mut headers = vec![
            (":method".to_string(), "GET".to_string()),
            (":path".to_string(), path.clone()),
            (":authority".to_string(), self.authority.clone()),
            ("accept".to_string(), accept.to_string()),
            (PEER_PROXIED_HEADER.to_string(), "true".to_string()),
        ];
        headers.extend(self.extra_headers.iter().cloned());
        let address_header = self.leases.as_ref().map(|l| l.address_header.clone());
        let cluster = match self.servers.get_mut(server) {
            Some(s) => {
                if purpose != Purpose::Leases {
                    s.work.pending += 1;
                }
                if let Some((etag, _)) = s.cache.get(&path) {
                    headers.push(("if-none-match".to_string(), etag.clone()));
                }
                if let (Some(h), Some(a)) = (address_header, &s.reference.address) {
                    headers.push((h, a.clone()));
                }
                s.reference.cluster.clone()
            }
            None => String::new(),
        };
        self.in_flight.insert(id, InFlight { server, purpose, path });
        Fetch { id, cluster, headers }
    }

    /// Feeds one answer; returns follow-up fetches, errors, and a snapshot when a round ends.
    pub fn on_response(&mut self, id: u64, outcome: Outcome, now_ms: u64) -> Step {
        let mut step = Step::default();
        let Some(InFlight {
            server: si,
            purpose,
            path,
        }) = self.in_flight.remove(&id)
        else {
            return step;
        };
        let name = match self.servers.get(si) {
            Some(s) => s.reference.name.clone(),
            None => return step,
        };
        if purpose == Purpose::Leases {
            match self.interpret_leases(outcome) {
                Ok(peers) => self.apply_leases(peers, now_ms, &mut step),
                Err((kind, detail)) => step.errors.push(SyncError {
                    server: name,
                    kind,
                    detail: format!("{path}: {detail}"),
                }),
            }
        } else {
            match self.interpret(si, &path, outcome) {
                Ok(doc) => self.absorb(si, purpose, doc, &mut step),
                Err((kind, detail)) => {
                    if let Some(s) = self.servers.get_mut(si) {
                        s.work.unreachable |= kind == SyncErrorKind::Unreachable;
                    }
                    step.errors.push(SyncError {
                        server: name,
                        kind,
                        detail: format!("{path}: {detail}"),
                    });
                }
            }
            if let Some(s) = self.servers.get_mut(si) {
                s.work.pending = s.work.pending.saturating_sub(1);
                if s.work.pending == 0 && s.refetch {
                    s.refetch = false;
                    self.start_server(si, &mut step);
                } else if s.work.pending == 0 {
                    let shared = self.shared_docs(si);
                    if let Some(s) = self.servers.get_mut(si) {
                        self.dirty |= finish_server(s, now_ms, &shared);
                    }
                }
            }
        }
        if self.in_flight.is_empty() && self.round_deadline_ms.is_some() {
            self.round_deadline_ms = None;
            self.round_completed_ms = Some(now_ms);
            let before = self.servers.len();
            self.servers.retain(|s| !s.leaving);
            self.dirty |= self.servers.len() != before;
            step.publish = self.build(now_ms);
        }
        step
    }

    /// The error for an outcome without a usable HTTP response.
    fn no_answer(&self, outcome: Outcome) -> (SyncErrorKind, String) {
        match outcome {
            Outcome::Unreachable => (SyncErrorKind::Unreachable, "cannot connect".into()),
            Outcome::NoResponse | Outcome::Response { .. } => (SyncErrorKind::Reset, "no response".into()),
            Outcome::Overdue => (SyncErrorKind::Timeout, "no answer before the round's deadline".into()),
            Outcome::Oversized => (
                SyncErrorKind::Oversized,
                format!("body larger than {} bytes", self.max_bytes),
            ),
        }
    }

    fn interpret_leases(&self, outcome: Outcome) -> Result<Vec<LeasePeer>, (SyncErrorKind, String)> {
        let Some(config) = &self.leases else {
            return Err((SyncErrorKind::Decode, "lease mode is off".into()));
        };
        let body = match outcome {
            Outcome::Response { status: 200, body, .. } => body,
            Outcome::Response { status, .. } => return Err((SyncErrorKind::HttpStatus, format!("HTTP {status}"))),
            failed => return Err(self.no_answer(failed)),
        };
        let own = leases::Own {
            hostname: config.local_hostname.clone(),
            address: config.local_address.clone(),
        };
        leases::parse_lease_list_at(&body, &own, &config.hosts, config.peer_port)
            .map_err(|e| (SyncErrorKind::Decode, e))
    }

    /// Applies a lease list: new live leases become members (fetched at once), a changed holder
    /// means the server restarted (its API set is unknown again and fetched at once), and members
    /// whose lease is gone or expired leave when the round ends.
    fn apply_leases(&mut self, peers: Vec<LeasePeer>, now_ms: u64, step: &mut Step) {
        let Some(config) = self.leases.clone() else { return };
        self.dirty |= !self.leases_listed;
        self.leases_listed = true;
        let live: Vec<LeasePeer> = peers.into_iter().filter(|p| p.is_live(now_ms)).collect();
        for s in self.servers.iter_mut().filter(|s| s.lease.is_some()) {
            let id = s.lease.as_ref().map(|l| l.id.clone()).unwrap_or_default();
            if !live.iter().any(|p| p.id == id) && !s.leaving {
                log::info!("kube-peer-proxy: apiserver {} left (lease {id} gone)", s.reference.name);
                s.leaving = true;
            }
        }
        for p in live {
            let existing = self
                .servers
                .iter()
                .position(|s| !s.leaving && s.lease.as_ref().is_some_and(|l| l.id == p.id));
            match existing {
                Some(i) => {
                    let Some(s) = self.servers.get_mut(i) else { continue };
                    let restarted = s.lease.as_ref().is_some_and(|l| l.holder != p.holder);
                    let moved = s.reference.address != p.address;
                    s.lease = Some(p.clone());
                    if restarted || moved {
                        log::info!(
                            "kube-peer-proxy: apiserver {} restarted; its API set is refetched",
                            s.reference.name
                        );
                        s.reference.address = p.address.clone();
                        s.core = Part::default();
                        s.groups = Part::default();
                        s.cache.clear();
                        s.reachable = true;
                        self.dirty = true;
                        if s.work.pending == 0 {
                            self.start_server(i, step);
                        } else {
                            s.refetch = true;
                        }
                    }
                }
                None => {
                    if self.servers.len() >= snapshot::MAX_SERVERS {
                        log::warn!(
                            "kube-peer-proxy: more than {} apiservers; lease {} ignored",
                            snapshot::MAX_SERVERS,
                            p.id
                        );
                        continue;
                    }
                    let name = if p.hostname.is_empty() {
                        p.id.clone()
                    } else {
                        p.hostname.clone()
                    };
                    log::info!(
                        "kube-peer-proxy: apiserver {name} joined (lease {}, address {})",
                        p.id,
                        p.address.as_deref().unwrap_or("unknown")
                    );
                    let reference = ServerRef {
                        name,
                        cluster: config.cluster.clone(),
                        local: false,
                        address: p.address.clone(),
                    };
                    self.servers.push(Server::new(reference, Some(p)));
                    self.dirty = true;
                    let i = self.servers.len().saturating_sub(1);
                    self.start_server(i, step);
                }
            }
        }
    }

    /// Members whose lease expired (renewTime + leaseDurationSeconds) leave even while the lease
    /// list cannot be read.
    fn expire_leases(&mut self, now_ms: u64) {
        let before = self.servers.len();
        self.servers
            .retain(|s| s.lease.as_ref().is_none_or(|l| l.is_live(now_ms)) && !s.leaving);
        if self.servers.len() != before {
            self.dirty = true;
        }
    }

    /// Turns an HTTP outcome into a parsed document (or the cached one for a 304).
    fn interpret(&mut self, si: usize, path: &str, outcome: Outcome) -> Result<Doc, (SyncErrorKind, String)> {
        let (status, content_type, etag, body) = match outcome {
            Outcome::Response {
                status,
                content_type,
                etag,
                body,
            } => (status, content_type, etag, body),
            failed => return Err(self.no_answer(failed)),
        };
        // The document another server holds under the same ETag (apiservers hash what they send),
        // shared instead of parsed: during an upgrade most servers send the same bytes.
        let same = match (status, etag.as_deref()) {
            (200, Some(t)) if !t.is_empty() && discovery::is_aggregated_content_type(&content_type) => {
                self.servers.iter().enumerate().find_map(|(i, o)| {
                    let part = match path {
                        "/api" => &o.core,
                        "/apis" => &o.groups,
                        _ => return None,
                    };
                    (i != si && part.etag.as_deref() == Some(t))
                        .then(|| part.docs.clone())
                        .flatten()
                })
            }
            _ => None,
        };
        let server = self
            .servers
            .get_mut(si)
            .ok_or((SyncErrorKind::Reset, "unknown server".to_string()))?;
        match status {
            304 => server
                .cache
                .get(path)
                .map(|(_, d)| d.clone())
                .ok_or((SyncErrorKind::HttpStatus, "304 without a cached document".into())),
            200 => {
                if body.len() > self.max_bytes {
                    return Err((SyncErrorKind::Oversized, format!("body of {} bytes", body.len())));
                }
                let doc = match same {
                    Some(docs) => Doc::Aggregated(docs, None),
                    None => parse_doc(path, &content_type, &body).map_err(|e| (SyncErrorKind::Decode, e))?,
                };
                let doc = match (doc, &etag) {
                    (Doc::Aggregated(docs, _), Some(t)) if !t.is_empty() => Doc::Aggregated(docs, Some(t.clone())),
                    (doc, _) => doc,
                };
                match etag {
                    Some(t) if !t.is_empty() => {
                        let cached = match &doc {
                            Doc::Aggregated(..) => Doc::Unchanged,
                            other => other.clone(),
                        };
                        server.cache.insert(path.to_string(), (t, cached));
                    }
                    _ => {
                        server.cache.remove(path);
                    }
                }
                Ok(doc)
            }
            404 if path == "/api" => Ok(Doc::Absent),
            503 => Err((SyncErrorKind::Unavailable, "HTTP 503".into())),
            504 => Err((SyncErrorKind::Timeout, "HTTP 504".into())),
            other => Err((SyncErrorKind::HttpStatus, format!("HTTP {other}"))),
        }
    }

    /// The documents the other servers hold, to share an equal one (see [`Part::docs`]).
    fn shared_docs(&self, si: usize) -> Vec<Rc<Vec<GroupDiscovery>>> {
        self.servers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != si)
            .flat_map(|(_, o)| [&o.core.docs, &o.groups.docs])
            .flatten()
            .cloned()
            .collect()
    }

    fn absorb(&mut self, si: usize, purpose: Purpose, doc: Doc, step: &mut Step) {
        let mut follow: Vec<(String, Purpose)> = Vec::new();
        let Some(s) = self.servers.get_mut(si) else { return };
        let w = &mut s.work;
        match (purpose, doc) {
            (Purpose::ApiRoot, Doc::Aggregated(items, etag)) => w.core = PartWork::Docs(items, etag),
            // No core group (an aggregated API server).
            (Purpose::ApiRoot, Doc::Absent) => w.core = PartWork::Docs(Rc::new(Vec::new()), None),
            (Purpose::ApiRoot, Doc::Unchanged) => w.core = PartWork::Unchanged,
            (Purpose::ApisRoot, Doc::Unchanged) => w.groups = PartWork::Unchanged,
            (Purpose::ApiRoot, Doc::ApiVersions(versions)) => {
                for (i, v) in versions.iter().enumerate() {
                    follow.push((format!("/api/{v}"), Purpose::CoreVersion(i)));
                }
                w.core = PartWork::Legacy(versions.into_iter().map(|v| (String::new(), v, None)).collect());
            }
            (Purpose::ApisRoot, Doc::Aggregated(items, etag)) => w.groups = PartWork::Docs(items, etag),
            (Purpose::ApisRoot, Doc::GroupList(groups)) => {
                let mut walk = Vec::new();
                for (g, vs) in groups {
                    for v in vs {
                        follow.push((format!("/apis/{g}/{v}"), Purpose::GroupVersion(walk.len())));
                        walk.push((g.clone(), v, None));
                    }
                }
                w.groups = PartWork::Legacy(walk);
            }
            (Purpose::CoreVersion(i), Doc::ResourceList(v)) => {
                if let PartWork::Legacy(walk) = &mut w.core {
                    if let Some((_, _, slot)) = walk.get_mut(i) {
                        *slot = Some(v);
                    }
                }
            }
            (Purpose::GroupVersion(i), Doc::ResourceList(v)) => {
                if let PartWork::Legacy(walk) = &mut w.groups {
                    if let Some((_, _, slot)) = walk.get_mut(i) {
                        *slot = Some(v);
                    }
                }
            }
            (purpose, _) => {
                // E.g. an aggregated list where a resource list belongs: unusable, count it.
                match purpose {
                    Purpose::ApiRoot => w.core = PartWork::Failed,
                    Purpose::ApisRoot => w.groups = PartWork::Failed,
                    _ => {}
                }
                step.errors.push(SyncError {
                    server: s.reference.name.clone(),
                    kind: SyncErrorKind::Decode,
                    detail: format!("unexpected document type for {purpose:?}"),
                });
            }
        }
        for (path, purpose) in follow {
            step.fetches.push(self.fetch(si, path, purpose));
        }
    }

    /// Builds the snapshot of every member; returns it only when it differs from the last one.
    fn build(&mut self, now_ms: u64) -> Option<Publish> {
        let staleness = self.staleness_ms;
        let members: Vec<&Server> = ordered(&self.servers);
        let membership_unknown = self.leases.is_some() && !self.leases_listed;
        let inputs: BuildInputs = (
            membership_unknown,
            members
                .iter()
                .map(|s| {
                    (
                        s.reference.name.clone(),
                        s.core.docs.is_some(),
                        s.groups.docs.is_some(),
                        s.core.fresh(now_ms, staleness),
                        s.groups.fresh(now_ms, staleness),
                        s.reachable,
                    )
                })
                .collect(),
        );
        if !self.dirty && self.last_built.as_ref() == Some(&inputs) {
            return None;
        }
        self.dirty = false;
        self.builds += 1;
        self.last_built = Some(inputs);
        let unknown: Vec<Vec<(String, String)>> = members
            .iter()
            .map(|s| s.core.unknown.iter().chain(&s.groups.unknown).cloned().collect())
            .collect();
        let table_members: Vec<Member> = members
            .iter()
            .zip(&unknown)
            .map(|(s, unknown)| Member {
                server: s.reference.clone(),
                core: s.core.docs.as_deref().map(Vec::as_slice),
                groups: s.groups.docs.as_deref().map(Vec::as_slice),
                unknown_versions: unknown,
                fresh_core: s.core.fresh(now_ms, staleness),
                fresh_groups: s.groups.fresh(now_ms, staleness),
                reachable: s.reachable,
            })
            .collect();
        let mut snapshot = Snapshot::build(&table_members, membership_unknown);
        let fingerprint = snapshot.table.encode();
        if self.published.as_ref() == Some(&fingerprint) {
            return None;
        }
        self.published = Some(fingerprint);
        self.generation += 1;
        snapshot.table.generation = self.generation;
        snapshot.table.built_ms = now_ms;
        Some(snapshot)
    }
}

/// Servers by name, the local one not privileged (upstream `peer_aggregated_handler.go` sorts by
/// server identity): the merge's precedence, so every node that sees the same documents builds the
/// same merged documents and ETags, and a stable table layout.
fn ordered(servers: &[Server]) -> Vec<&Server> {
    let mut v: Vec<&Server> = servers.iter().filter(|s| !s.leaving).collect();
    v.sort_by(|a, b| a.reference.name.cmp(&b.reference.name));
    v
}

/// Ends a server's part of a round. Returns whether what the snapshot is built from changed.
fn finish_server(s: &mut Server, now_ms: u64, shared: &[Rc<Vec<GroupDiscovery>>]) -> bool {
    // An equal document another server already holds is shared instead of kept twice.
    let share = |docs: Rc<Vec<GroupDiscovery>>| -> Rc<Vec<GroupDiscovery>> {
        shared.iter().find(|d| **d == docs).cloned().unwrap_or(docs)
    };
    let w = std::mem::take(&mut s.work);
    let mut changed = s.reachable == w.unreachable;
    s.reachable = !w.unreachable;
    for (part, work) in [(&mut s.core, w.core), (&mut s.groups, w.groups)] {
        match work {
            PartWork::Failed => {}
            PartWork::Unchanged => {
                if part.docs.is_some() {
                    part.last_ms = Some(now_ms);
                } else {
                    // A 304 for a document we do not hold: forget the ETags so the next round
                    // fetches everything again.
                    s.cache.clear();
                }
            }
            PartWork::Docs(docs, etag) => {
                changed |= part.docs.as_ref() != Some(&docs) || !part.unknown.is_empty();
                part.docs = Some(share(docs));
                part.etag = etag;
                part.unknown.clear();
                part.last_ms = Some(now_ms);
            }
            PartWork::Legacy(walk) => {
                let (docs, unknown) = assemble_legacy(walk, part.docs.as_deref().map(Vec::as_slice));
                // A fresh document may still say what we had (legacy servers have no ETags).
                changed |= part.docs.as_deref() != Some(&docs) || part.unknown != unknown;
                part.docs = Some(share(Rc::new(docs)));
                part.etag = None;
                part.unknown = unknown;
                part.last_ms = Some(now_ms);
            }
        }
    }
    changed
}

/// Groups from a legacy walk. A group/version whose resource list failed keeps its previously
/// learned resources, or is listed as unknown if it has none.
fn assemble_legacy(
    walk: Vec<(String, String, Option<VersionDiscovery>)>,
    old: Option<&[GroupDiscovery]>,
) -> (Vec<GroupDiscovery>, Vec<(String, String)>) {
    let mut groups: Vec<GroupDiscovery> = Vec::new();
    let mut unknown = Vec::new();
    for (g, v, slot) in walk {
        let version = slot.or_else(|| {
            old?.iter()
                .find(|og| og.metadata.name == g)?
                .versions
                .iter()
                .find(|ov| ov.version == v)
                .cloned()
        });
        let Some(version) = version else {
            unknown.push((g, v));
            continue;
        };
        match groups.last_mut() {
            Some(last) if last.metadata.name == g => last.versions.push(version),
            _ => groups.push(GroupDiscovery {
                metadata: GroupMeta { name: g },
                versions: vec![version],
            }),
        }
    }
    (groups, unknown)
}

fn parse_doc(path: &str, content_type: &str, body: &[u8]) -> Result<Doc, String> {
    let e = |e: discovery::ParseError| e.to_string();
    if discovery::is_aggregated_content_type(content_type) {
        let list = discovery::parse_aggregated(body).map_err(e)?;
        return Ok(Doc::Aggregated(Rc::new(list.items), None));
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api"] => Ok(Doc::ApiVersions(
            discovery::parse_api_versions(body).map_err(e)?.versions,
        )),
        ["apis"] => Ok(Doc::GroupList(
            discovery::parse_group_list(body)
                .map_err(e)?
                .groups
                .into_iter()
                .map(|g| (g.name, g.versions.into_iter().map(|v| v.version).collect()))
                .collect(),
        )),
        ["api", v] | ["apis", _, v] => {
            let list = discovery::parse_resource_list(body).map_err(e)?;
            Ok(Doc::ResourceList(discovery::version_from_legacy(v, &list)))
        }
        _ => Err(format!("unexpected discovery path {path}")),
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
