//! Discovery synchronisation for the local server and every peer (upstream's `local_discovery.go`
//! and `peer_discovery.go` in one state machine, with no host calls so it is tested natively).
//!
//! Each round fetches `/api` and `/apis` from every member with the `profile=nopeer` Accept list
//! and `x-kubernetes-peer-proxied: true`, reusing ETags so unchanged documents cost a 304. A server
//! that answers legacy discovery is walked through `/api/<v>` and `/apis/<g>/<v>`: the group
//! versions of its `APIGroupList` and of its OpenAPI v3 index (`/openapi/v3`, see
//! [`crate::discovery::openapi_index`]: the `APIGroupList` follows the APIService objects shared by
//! every member, the index what the server itself serves).
//!
//! Membership is separate from freshness: a member is every configured server, or in lease mode
//! every server whose identity lease is live (or whose IP the EndpointSlice `default/kubernetes`
//! lists). What a member was last seen to serve is kept however old it gets (it is routed to only
//! while fresh); `/api`, `/apis` and each legacy group/version are learned separately, so a
//! partial answer counts for what it did answer.
//!
//! This module holds the state; each job has its own file: `rounds` (scheduling: rounds, fetches,
//! where each answer goes), `membership` (lease or EndpointSlice membership), [`answers`]
//! (interpreting an answer), `legacy` (what an answer adds, and the legacy walk), `build` (the
//! snapshot), `local_ready` (the local server's readiness, probed every tick).

use std::collections::HashMap;
use std::rc::Rc;

pub mod answers;
mod build;
mod legacy;
mod local_ready;
mod membership;
mod rounds;

use crate::config::{Config, LeaseDiscovery};
use crate::discovery::documents::{GroupDiscovery, VersionDiscovery};
use crate::discovery::leases::LeasePeer;
use crate::snapshot::{ServerRef, Snapshot};
use build::BuildInputs;

/// client-go `AcceptV2NoPeer`, then v2, v2beta1 (servers 1.26–1.29) and legacy JSON.
pub const DISCOVERY_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// A request the host adapter must dispatch and answer with [`Syncer::on_response`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub id: u64,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    /// How long the host waits for the answer.
    pub timeout_ms: u64,
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

/// A discovery answer's body: held in memory, or left where it is and read in pieces. The
/// discovery service leaves it in Envoy's buffer: an aggregated document is parsed straight from
/// there, so the VM never holds a copy of it beside its parse (8 MiB for 20 000 resources), and a
/// VM's memory never shrinks once it has grown.
#[derive(Clone, Default)]
pub enum Body {
    #[default]
    Empty,
    Bytes(Vec<u8>),
    /// `len` bytes, `read(start, max)` giving the next piece (`None` once it cannot be read).
    Pieces {
        len: usize,
        read: Rc<dyn Fn(usize, usize) -> Option<Vec<u8>>>,
    },
}

/// The size of the pieces a [`Body::Pieces`] is read in.
const PIECE: usize = 64 * 1024;

impl Body {
    pub fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::Bytes(b) => b.len(),
            Body::Pieces { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole body in memory (small documents: legacy discovery, lease lists).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        // Reading a Vec cannot fail; a body that stops early is cut short, and its parse fails.
        let _ = std::io::Read::read_to_end(&mut self.reader(), &mut out);
        out
    }

    /// Reads the body from its start; a piece that cannot be read is an I/O error (the parse that
    /// reads it fails and the server keeps its last good data).
    pub fn reader(&self) -> impl std::io::Read + '_ {
        BodyReader {
            body: self,
            next: 0,
            piece: Vec::new(),
            at: 0,
        }
    }
}

impl From<Vec<u8>> for Body {
    fn from(b: Vec<u8>) -> Body {
        Body::Bytes(b)
    }
}

/// Equal bytes (read whole: for tests and tools, not the service).
impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        self.len() == other.len() && self.to_vec() == other.to_vec()
    }
}

impl Eq for Body {}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Body({} bytes)", self.len())
    }
}

struct BodyReader<'a> {
    body: &'a Body,
    /// Where the next piece starts.
    next: usize,
    piece: Vec<u8>,
    /// How much of `piece` was read.
    at: usize,
}

impl std::io::Read for BodyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest: &[u8] = match self.body {
            Body::Empty => &[],
            Body::Bytes(b) => b.get(self.next..).unwrap_or_default(),
            Body::Pieces { len, read } => {
                if self.at >= self.piece.len() && self.next < *len {
                    let want = PIECE.min(len - self.next);
                    self.piece = match read(self.next, want) {
                        Some(p) if !p.is_empty() && p.len() <= want => p,
                        _ => return Err(std::io::Error::other("the body could not be read")),
                    };
                    self.at = 0;
                    self.next += self.piece.len();
                }
                self.piece.get(self.at..).unwrap_or_default()
            }
        };
        let n = rest.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), rest.get(..n)) {
            dst.copy_from_slice(src);
        }
        match self.body {
            Body::Pieces { .. } => self.at += n,
            _ => self.next += n,
        }
        Ok(n)
    }
}

/// What came back for a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Response {
        status: u16,
        content_type: String,
        etag: Option<String>,
        body: Body,
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
    /// The local server's readiness probe (see `local_ready`), answered like a fetch.
    pub probe: Option<Fetch>,
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
    /// `/openapi/v3` (legacy servers): more group versions to walk.
    OpenApiIndex,
    /// The membership document (lease mode; fetched from the local server): the identity lease
    /// list, or the EndpointSlice `default/kubernetes`.
    Members,
}

/// A parsed document, cached with its ETag so a 304 can reuse it.
#[derive(Debug, Clone)]
enum Doc {
    /// An aggregated list, and the ETag it came with.
    Aggregated(Rc<Vec<GroupDiscovery>>, Option<String>),
    ApiVersions(Vec<String>),
    GroupList(Vec<(String, Vec<String>)>),
    ResourceList(VersionDiscovery),
    /// `/api` answered 404 (aggregated API servers have no core group), or a group version's
    /// `/api/<v>` or `/apis/<g>/<v>` did (the server does not serve it).
    Absent,
    /// The group versions of an OpenAPI v3 index.
    OpenApiIndex(Vec<(String, String)>),
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
    /// A legacy walk: `(group, version, what its fetch said)`, in the server's order (the
    /// `APIGroupList`'s, then the OpenAPI index's other group versions).
    Legacy(Vec<(String, String, Walked)>),
}

/// What the fetch of one group version of a legacy walk said.
#[derive(Debug, Default)]
enum Walked {
    /// No usable answer (yet): its previous resources are kept, or it is unknown.
    #[default]
    Failed,
    /// 404: not served there (known, not unknown).
    NotServed,
    Served(VersionDiscovery),
}

#[derive(Debug, Default)]
struct Work {
    pending: usize,
    /// A fetch could not reach the server at all (as opposed to a bad answer).
    unreachable: bool,
    core: PartWork,
    groups: PartWork,
    /// `/openapi/v3` was asked for this round.
    index_asked: bool,
    /// Its answer (or failure) is in: the walk follows [`Server::openapi`].
    index_in: bool,
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
    /// The identity lease (or slice entry) that makes it a member (lease mode peers only).
    lease: Option<LeasePeer>,
    core: Part,
    groups: Part,
    /// Whether the server answered its last finished round (even with an unusable document).
    reachable: bool,
    cache: HashMap<String, (String, Doc)>,
    /// The group versions of the last good OpenAPI v3 index (legacy servers), kept when a later
    /// one fails.
    openapi: Vec<(String, String)>,
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
            openapi: Vec::new(),
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
    /// Fingerprint of the last published table (an ETag of its encoding, not the megabytes).
    published: Option<String>,
    /// Fingerprint, version and entry slot of the last published key set (see `snapshot::bucket_key`).
    published_keys: Option<String>,
    keys_version: u64,
    keys_slot: u8,
    round_completed_ms: Option<u64>,
    /// Some server's data or membership changed since the last build.
    dirty: bool,
    /// How many times a snapshot was built (merged, encoded, compared): unchanged rounds must not.
    builds: u64,
    last_built: Option<BuildInputs>,
    leases: Option<LeaseDiscovery>,
    /// Lease mode: whether a lease list (or EndpointSlice) has ever been read (before that,
    /// membership is unknown).
    leases_listed: bool,
    local_ready: local_ready::LocalReady,
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
            published_keys: None,
            keys_version: 0,
            keys_slot: 0,
            round_completed_ms: None,
            dirty: true,
            builds: 0,
            last_built: None,
            leases: c.lease_discovery.clone(),
            leases_listed: false,
            local_ready: local_ready::LocalReady::default(),
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
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
