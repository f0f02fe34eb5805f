//! Discovery synchronisation for the local server and every peer (upstream's `local_discovery.go`
//! and `peer_discovery.go` in one state machine, with no host calls so it is tested natively).
//!
//! Each round fetches `/api` and `/apis` from every server with the `profile=nopeer` Accept list
//! and `x-kubernetes-peer-proxied: true`, reusing ETags so unchanged documents cost a 304. A server
//! that answers legacy discovery is walked through `/api/<v>` and `/apis/<g>/<v>`. A failed server
//! keeps its last good data until the staleness limit, then drops out of the snapshot.

use std::collections::HashMap;

use crate::config::Config;
use crate::discovery::{self, GroupDiscovery, GroupMeta, VersionDiscovery};
use crate::merge;
use crate::routing::PEER_PROXIED_HEADER;
use crate::snapshot::{self, ServerDiscovery, ServerRef, Table};

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

/// A sync failure, counted by the adapter as `discovery_sync_errors_total{type,server}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncError {
    pub server: String,
    pub kind: &'static str,
    pub detail: String,
}

/// A snapshot ready to be written to shared data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub table: Table,
    pub merged_apis: Vec<u8>,
    pub merged_api: Vec<u8>,
    /// The merged `/apis` as a legacy `APIGroupList`.
    pub merged_apis_legacy: Vec<u8>,
}

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
    CoreVersion(usize),
    GroupVersion(usize, usize),
}

/// A parsed document, cached with its ETag so a 304 can reuse it.
#[derive(Debug, Clone)]
enum Doc {
    Aggregated(Vec<GroupDiscovery>),
    ApiVersions(Vec<String>),
    GroupList(Vec<(String, Vec<String>)>),
    ResourceList(VersionDiscovery),
    /// `/api` answered 404 (aggregated API servers have no core group).
    Absent,
    /// What the cache holds for an aggregated document: a 304 means "keep the server's current
    /// data", so the (large) parsed document is not kept twice or cloned.
    Unchanged,
}

#[derive(Debug, Default)]
struct Work {
    pending: usize,
    failed: bool,
    /// A fetch could not reach the server at all (as opposed to a bad answer).
    unreachable: bool,
    /// `None`: unchanged (304), keep the server's current core group.
    core: Option<Vec<GroupDiscovery>>,
    core_versions: Vec<Option<VersionDiscovery>>,
    /// `None`: unchanged (304), keep the server's current groups.
    groups: Option<Vec<GroupDiscovery>>,
    legacy_groups: Vec<(String, Vec<Option<VersionDiscovery>>)>,
}

#[derive(Debug)]
struct Server {
    reference: ServerRef,
    data: Option<ServerDiscovery>,
    last_success_ms: Option<u64>,
    /// Whether the server answered its last finished round (even with an unusable document).
    reachable: bool,
    cache: HashMap<String, (String, Doc)>,
    work: Work,
}

pub struct Syncer {
    servers: Vec<Server>,
    authority: String,
    extra_headers: Vec<(String, String)>,
    refresh_ms: u64,
    fetch_timeout_ms: u64,
    staleness_ms: u64,
    max_bytes: usize,
    next_id: u64,
    in_flight: HashMap<u64, (usize, Purpose, String)>,
    round_deadline_ms: Option<u64>,
    next_round_ms: u64,
    generation: u64,
    published: Option<Vec<u8>>,
    round_completed_ms: Option<u64>,
    /// Some server's data or reachability changed since the last build.
    dirty: bool,
    /// How many times a snapshot was built (merged, encoded, compared): unchanged rounds must not.
    builds: u64,
    /// Fresh servers and their reachability at the last build: with `dirty`, decides whether a
    /// finished round needs a new snapshot at all (most rounds are all 304s).
    last_built: Option<Vec<(String, bool)>>,
}

impl Syncer {
    pub fn new(c: &Config) -> Syncer {
        let mut servers = vec![ServerRef {
            name: c.local_name.clone(),
            cluster: c.local_cluster.clone(),
            local: true,
        }];
        servers.extend(c.peers.iter().map(|p| ServerRef {
            name: p.name.clone(),
            cluster: p.cluster.clone(),
            local: false,
        }));
        Syncer {
            servers: servers
                .into_iter()
                .map(|reference| Server {
                    reference,
                    data: None,
                    last_success_ms: None,
                    reachable: true,
                    cache: HashMap::new(),
                    work: Work::default(),
                })
                .collect(),
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

    /// Per-server `(name, last success ms)` for metrics.
    pub fn server_status(&self) -> impl Iterator<Item = (&str, Option<u64>)> {
        self.servers
            .iter()
            .map(|s| (s.reference.name.as_str(), s.last_success_ms))
    }

    /// `(cluster, last success ms)` of servers that answered their last round: a passive "down"
    /// mark older than that success is obsolete.
    pub fn answering_clusters(&self) -> impl Iterator<Item = (&str, u64)> {
        self.servers
            .iter()
            .filter(|s| s.reachable)
            .filter_map(|s| Some((s.reference.cluster.as_str(), s.last_success_ms?)))
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
        // Legacy servers need a second phase of fetches, hence room for two timeouts and slack.
        self.round_deadline_ms =
            Some(now_ms.saturating_add(self.fetch_timeout_ms.saturating_mul(2).saturating_add(500)));
        for i in 0..self.servers.len() {
            if let Some(s) = self.servers.get_mut(i) {
                s.work = Work::default();
            }
            step.fetches.push(self.fetch(i, "/api".to_string(), Purpose::ApiRoot));
            step.fetches.push(self.fetch(i, "/apis".to_string(), Purpose::ApisRoot));
        }
        step
    }

    fn fetch(&mut self, server: usize, path: String, purpose: Purpose) -> Fetch {
        let id = self.next_id;
        self.next_id += 1;
        let mut headers = vec![
            (":method".to_string(), "GET".to_string()),
            (":path".to_string(), path.clone()),
            (":authority".to_string(), self.authority.clone()),
            ("accept".to_string(), DISCOVERY_ACCEPT.to_string()),
            (PEER_PROXIED_HEADER.to_string(), "true".to_string()),
        ];
        headers.extend(self.extra_headers.iter().cloned());
        let cluster = match self.servers.get_mut(server) {
            Some(s) => {
                s.work.pending += 1;
                if let Some((etag, _)) = s.cache.get(&path) {
                    headers.push(("if-none-match".to_string(), etag.clone()));
                }
                s.reference.cluster.clone()
            }
            None => String::new(),
        };
        self.in_flight.insert(id, (server, purpose, path));
        Fetch { id, cluster, headers }
    }

    /// Feeds one answer; returns follow-up fetches, errors, and a snapshot when a round ends.
    pub fn on_response(&mut self, id: u64, outcome: Outcome, now_ms: u64) -> Step {
        let mut step = Step::default();
        let Some((si, purpose, path)) = self.in_flight.remove(&id) else {
            return step;
        };
        let name = match self.servers.get(si) {
            Some(s) => s.reference.name.clone(),
            None => return step,
        };
        match self.interpret(si, &path, outcome) {
            Ok(doc) => self.absorb(si, purpose, doc, &mut step),
            Err((kind, detail)) => {
                if let Some(s) = self.servers.get_mut(si) {
                    s.work.failed = true;
                    s.work.unreachable |= kind == "unreachable";
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
            if s.work.pending == 0 {
                self.dirty |= finish_server(s, now_ms);
            }
        }
        if self.in_flight.is_empty() && self.round_deadline_ms.is_some() {
            self.round_deadline_ms = None;
            self.round_completed_ms = Some(now_ms);
            step.publish = self.build(now_ms);
        }
        step
    }

    /// Turns an HTTP outcome into a parsed document (or the cached one for a 304).
    fn interpret(&mut self, si: usize, path: &str, outcome: Outcome) -> Result<Doc, (&'static str, String)> {
        let (status, content_type, etag, body) = match outcome {
            Outcome::Unreachable => return Err(("unreachable", "cannot connect".into())),
            Outcome::NoResponse => return Err(("reset", "no response".into())),
            Outcome::Overdue => return Err(("timeout", "no answer before the round's deadline".into())),
            Outcome::Oversized => return Err(("oversized", format!("body larger than {} bytes", self.max_bytes))),
            Outcome::Response {
                status,
                content_type,
                etag,
                body,
            } => (status, content_type, etag, body),
        };
        let server = self.servers.get_mut(si).ok_or(("internal", String::new()))?;
        match status {
            304 => server
                .cache
                .get(path)
                .map(|(_, d)| d.clone())
                .ok_or(("http_status", "304 without a cached document".into())),
            200 => {
                if body.len() > self.max_bytes {
                    return Err(("oversized", format!("body of {} bytes", body.len())));
                }
                let doc = parse_doc(path, &content_type, &body).map_err(|e| ("decode", e))?;
                match etag {
                    Some(t) if !t.is_empty() => {
                        let cached = match &doc {
                            Doc::Aggregated(_) => Doc::Unchanged,
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
            503 => Err(("unavailable", "HTTP 503".into())),
            504 => Err(("timeout", "HTTP 504".into())),
            other => Err(("http_status", format!("HTTP {other}"))),
        }
    }

    fn absorb(&mut self, si: usize, purpose: Purpose, doc: Doc, step: &mut Step) {
        let mut follow: Vec<(String, Purpose)> = Vec::new();
        let Some(s) = self.servers.get_mut(si) else { return };
        let w = &mut s.work;
        match (purpose, doc) {
            (Purpose::ApiRoot, Doc::Aggregated(items)) => w.core = Some(items),
            // No core group (an aggregated API server): a change only if we had one.
            (Purpose::ApiRoot, Doc::Absent) => {
                if s.data.as_ref().is_none_or(|d| !d.core.is_empty()) {
                    w.core = Some(Vec::new());
                }
            }
            (Purpose::ApiRoot | Purpose::ApisRoot, Doc::Unchanged) => {}
            (Purpose::ApiRoot, Doc::ApiVersions(versions)) => {
                w.core_versions = vec![None; versions.len()];
                for (i, v) in versions.iter().enumerate() {
                    follow.push((format!("/api/{v}"), Purpose::CoreVersion(i)));
                }
            }
            (Purpose::ApisRoot, Doc::Aggregated(items)) => w.groups = Some(items),
            (Purpose::ApisRoot, Doc::GroupList(groups)) => {
                w.legacy_groups = groups.iter().map(|(g, vs)| (g.clone(), vec![None; vs.len()])).collect();
                for (gi, (g, vs)) in groups.iter().enumerate() {
                    for (vi, v) in vs.iter().enumerate() {
                        follow.push((format!("/apis/{g}/{v}"), Purpose::GroupVersion(gi, vi)));
                    }
                }
            }
            (Purpose::CoreVersion(i), Doc::ResourceList(v)) => {
                if let Some(slot) = w.core_versions.get_mut(i) {
                    *slot = Some(v);
                }
            }
            (Purpose::GroupVersion(gi, vi), Doc::ResourceList(v)) => {
                if let Some(slot) = w.legacy_groups.get_mut(gi).and_then(|(_, vs)| vs.get_mut(vi)) {
                    *slot = Some(v);
                }
            }
            (purpose, _) => {
                // E.g. an aggregated list where a resource list belongs: unusable, count it.
                w.failed = true;
                step.errors.push(SyncError {
                    server: s.reference.name.clone(),
                    kind: "decode",
                    detail: format!("unexpected document type for {purpose:?}"),
                });
            }
        }
        for (path, purpose) in follow {
            step.fetches.push(self.fetch(si, path, purpose));
        }
    }

    /// Builds the snapshot of fresh servers; returns it only when it differs from the last one.
    fn build(&mut self, now_ms: u64) -> Option<Publish> {
        let fresh_servers: Vec<&Server> = ordered(&self.servers)
            .into_iter()
            .filter(|s| s.data.is_some())
            .filter(|s| {
                s.last_success_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) <= self.staleness_ms)
            })
            .collect();
        let inputs: Vec<(String, bool)> = fresh_servers
            .iter()
            .map(|s| (s.reference.name.clone(), s.reachable))
            .collect();
        if !self.dirty && self.last_built.as_ref() == Some(&inputs) {
            return None;
        }
        self.dirty = false;
        self.builds += 1;
        self.last_built = Some(inputs);
        let fresh: Vec<(ServerRef, &ServerDiscovery)> = fresh_servers
            .iter()
            .filter_map(|s| s.data.as_ref().map(|d| (s.reference.clone(), d)))
            .collect();
        let apis: Vec<&[GroupDiscovery]> = fresh.iter().map(|(_, d)| d.groups.as_slice()).collect();
        let api: Vec<&[GroupDiscovery]> = fresh.iter().map(|(_, d)| d.core.as_slice()).collect();
        let merged_groups = merge::merge_groups(&apis);
        let merged_apis = discovery::to_v2_json(&merged_groups);
        let merged_apis_legacy = discovery::to_legacy_group_list_json(&merged_groups);
        let merged_api = discovery::to_v2_json(&merge::merge_groups(&api));
        let mut table = Table::build(&fresh);
        for (i, s) in fresh_servers.iter().enumerate().take(snapshot::MAX_SERVERS) {
            if !s.reachable {
                table.unhealthy |= 1u64 << i;
            }
        }
        table.apis_etag = snapshot::etag(&merged_apis);
        table.api_etag = snapshot::etag(&merged_api);
        table.apis_legacy_etag = snapshot::etag(&merged_apis_legacy);
        let fingerprint = table.encode();
        if self.published.as_ref() == Some(&fingerprint) {
            return None;
        }
        self.published = Some(fingerprint);
        self.generation += 1;
        table.generation = self.generation;
        table.built_ms = now_ms;
        Some(Publish {
            table,
            merged_apis,
            merged_api,
            merged_apis_legacy,
        })
    }
}

/// Local server first, then peers by name: the merge's precedence and a stable table layout.
fn ordered(servers: &[Server]) -> Vec<&Server> {
    let mut v: Vec<&Server> = servers.iter().collect();
    v.sort_by(|a, b| {
        b.reference
            .local
            .cmp(&a.reference.local)
            .then(a.reference.name.cmp(&b.reference.name))
    });
    v
}

/// Ends a server's part of a round. Returns whether what the snapshot is built from changed.
fn finish_server(s: &mut Server, now_ms: u64) -> bool {
    let w = std::mem::take(&mut s.work);
    let reachability_changed = s.reachable == w.unreachable;
    s.reachable = !w.unreachable;
    if w.failed {
        return reachability_changed;
    }
    let mut core = w.core;
    if !w.core_versions.is_empty() {
        core = Some(vec![GroupDiscovery {
            metadata: GroupMeta::default(),
            versions: w.core_versions.into_iter().flatten().collect(),
        }]);
    }
    let mut groups = w.groups;
    if !w.legacy_groups.is_empty() {
        groups = Some(
            w.legacy_groups
                .into_iter()
                .map(|(name, versions)| GroupDiscovery {
                    metadata: GroupMeta { name },
                    versions: versions.into_iter().flatten().collect(),
                })
                .collect(),
        );
    }
    // A fresh document may still say what we had (legacy servers have no ETags).
    let old = s.data.as_ref();
    let changed = core.as_ref().is_some_and(|c| old.is_none_or(|o| &o.core != c))
        || groups.as_ref().is_some_and(|g| old.is_none_or(|o| &o.groups != g));
    let (core, groups) = match (core, groups, s.data.take()) {
        (core, groups, Some(old)) => (core.unwrap_or(old.core), groups.unwrap_or(old.groups)),
        (Some(core), Some(groups), None) => (core, groups),
        // A 304 for a document we no longer hold (an earlier round failed half-way): forget the
        // ETags so the next round fetches everything again.
        _ => {
            s.cache.clear();
            return reachability_changed;
        }
    };
    s.data = Some(ServerDiscovery { core, groups });
    s.last_success_ms = Some(now_ms);
    changed || reachability_changed
}

fn parse_doc(path: &str, content_type: &str, body: &[u8]) -> Result<Doc, String> {
    let e = |e: discovery::ParseError| e.to_string();
    if discovery::is_aggregated_content_type(content_type) {
        let list = discovery::parse_aggregated(body).map_err(e)?;
        return Ok(Doc::Aggregated(list.items));
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
