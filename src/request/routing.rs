//! The routing decision, in the order of upstream `peerproxy_handler.go` `WrapHandler`
//! (`staging/src/k8s.io/apiserver/pkg/util/peerproxy/peerproxy_handler.go`): [`route`] is its
//! steps, each a named function after the upstream check it mirrors (the peer-proxied header,
//! `RequestInfoFrom` and `IsResourceRequest`, `HasFinishedSync`, `shouldServeLocally`,
//! `findServiceableByPeerFromPeerDiscoveryCache`, `resolveServingLocation`, `rand.Intn`), plus the
//! differences we choose on purpose: membership separate from freshness, the local server first with its
//! type-404 guarded while a 404 might be false, subresource-aware routing, peer-aggregated `/api`,
//! and forwarding per-group discovery.

use std::borrow::Cow;

use crate::request::accept::{self, DiscoveryChoice};
use crate::request::request_info::{self, NonResource, RequestKind};
use crate::snapshot::{self, Key, Table};

/// The request headers the decision reads.
#[derive(Debug, Clone, Default)]
pub struct RequestFacts<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub accept: Option<&'a str>,
    pub peer_proxied: Option<&'a str>,
}

/// Which merged discovery document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergedDoc {
    /// Aggregated v2 `/apis`.
    Apis,
    /// Aggregated v2 `/api` (the core group).
    Api,
    /// Legacy `APIGroupList` for `/apis`. (Legacy `/api` is always `v1`: the local answer is right.)
    ApisLegacy,
}

/// Labels for the rerouted-request metric (upstream: `code`, `group`, `version`, `resource`).
/// Borrowed from the request's path while it is routed (a request allocates nothing for it), owned
/// ([`Gvr::into_owned`]) where it outlives the request headers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gvr<'a> {
    pub group: Cow<'a, str>,
    pub version: Cow<'a, str>,
    pub resource: Cow<'a, str>,
}

impl Gvr<'_> {
    pub fn into_owned(self) -> Gvr<'static> {
        Gvr {
            group: Cow::Owned(self.group.into_owned()),
            version: Cow::Owned(self.version.into_owned()),
            resource: Cow::Owned(self.resource.into_owned()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Let the request continue to the local apiserver. Its answer stands, except that for
    /// [`LocalReason::ServedLocally`] and [`LocalReason::NotServedAnywhere`] a "type not served
    /// here" 404 is verified: it becomes a 503 if another member's discovery lists the type now
    /// ([`Route::guard`], [`Mode::Verified`]).
    Local(LocalReason),
    /// Let the request continue to the local apiserver, but a 404 meaning "this resource type is
    /// not served here" (see [`crate::request::not_found`]) becomes a 503: a peer is known to serve it, or
    /// some member's API set is unknown, so that 404 might be false.
    Guarded { reason: LocalReason, gvr: Gvr<'a> },
    /// Send to `servers[index]` of the table: the table said it serves the resource (its
    /// type-404 is strict), or nobody is known to and the local server cannot answer (step 7).
    Peer { index: usize, gvr: Gvr<'a> },
    /// Only unreachable members, or members whose data is stale, serve it: 503 with Retry-After
    /// rather than a false 404.
    Unavailable { gvr: Gvr<'a> },
    /// Answer with the merged discovery document.
    Merged(MergedDoc),
}

/// How a "type not served here" 404 is judged (see [`crate::request::guard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It becomes a 503 without asking anyone else.
    Strict,
    /// It stands only if no other member's discovery lists the type now.
    Verified,
}

/// What the 404 guard ([`crate::request::guard`]) needs of a request, decided with its routing (so the
/// path is parsed once and the mode is chosen where the table is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard<'a> {
    pub mode: Mode,
    pub subject: Subject<'a>,
}

/// What a guarded request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject<'a> {
    /// For a discovery document: its group and version (`""` for `/apis/<g>`), no resource.
    pub gvr: Gvr<'a>,
    /// A resource request's subresource, `""` for none.
    pub subresource: Cow<'a, str>,
    pub kind: Kind,
}

/// Object against type: which 404s a request can get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A resource request: its 404 may be a missing object's.
    Resource,
    /// A discovery document (`/api/<v>`, `/apis/<g>/<v>`, `/apis/<g>`): its 404 is about the type.
    Document,
}

impl<'a> Subject<'a> {
    /// The subject of a parsed request, or `None` for requests no 404 guard applies to.
    pub fn of(kind: &RequestKind<'a>) -> Option<Subject<'a>> {
        let (group, version, resource, subresource, kind) = match kind {
            RequestKind::Resource(r) => (r.group, r.version, r.resource, r.subresource, Kind::Resource),
            RequestKind::NonResource(NonResource::CoreVersion(v)) => ("", *v, "", "", Kind::Document),
            RequestKind::NonResource(NonResource::GroupVersion(g, v)) => (*g, *v, "", "", Kind::Document),
            RequestKind::NonResource(NonResource::Group(g)) => (*g, "", "", "", Kind::Document),
            _ => return None,
        };
        Some(Subject {
            gvr: Gvr {
                group: Cow::Borrowed(group),
                version: Cow::Borrowed(version),
                resource: Cow::Borrowed(resource),
            },
            subresource: Cow::Borrowed(subresource),
            kind,
        })
    }

    pub fn into_owned(self) -> Subject<'static> {
        Subject {
            gvr: self.gvr.into_owned(),
            subresource: Cow::Owned(self.subresource.into_owned()),
            kind: self.kind,
        }
    }

    /// The table keys the request is routed on: its own, then (for a subresource) its parent's.
    pub fn keys(&self) -> (Key<'_>, Option<Key<'_>>) {
        let g = &self.gvr;
        match self.kind {
            Kind::Document if g.version.is_empty() => (Key::group(&g.group), None),
            Kind::Document => (Key::version(&g.group, &g.version), None),
            Kind::Resource => {
                let rkey = Key::resource(&g.group, &g.version, &g.resource);
                if self.subresource.is_empty() {
                    (rkey, None)
                } else {
                    let skey = Key::subresource(&g.group, &g.version, &g.resource, &self.subresource);
                    (skey, Some(rkey))
                }
            }
        }
    }
}

/// A decision and, for a request whose 404 is guarded, what the guard needs (see [`crate::request::guard`]):
/// the filter acts on this, so it never parses the path again nor infers the mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route<'a> {
    pub decision: Decision<'a>,
    /// `Strict` for [`Decision::Guarded`] and a [`Decision::Peer`] that serves the resource,
    /// `Verified` for the local decisions noted at [`Decision::Local`] (and step 7's peer while
    /// every API set is known), `None` where the answer stands.
    pub guard: Option<Guard<'a>>,
}

impl<'a> Route<'a> {
    fn stands(decision: Decision<'a>) -> Route<'a> {
        Route { decision, guard: None }
    }

    /// To `servers[index]`; its type-404 is strict when `strict`, else verified.
    fn peer(index: usize, strict: bool, subject: Subject<'a>) -> Route<'a> {
        let mode = if strict { Mode::Strict } else { Mode::Verified };
        Route {
            decision: Decision::Peer {
                index,
                gvr: subject.gvr.clone(),
            },
            guard: Some(Guard { mode, subject }),
        }
    }

    /// Local; a type-404 is strict (`Guarded`) when `strict`, else verified.
    fn local(reason: LocalReason, strict: bool, subject: Subject<'a>) -> Route<'a> {
        let (decision, mode) = if strict {
            let gvr = subject.gvr.clone();
            (Decision::Guarded { reason, gvr }, Mode::Strict)
        } else {
            (Decision::Local(reason), Mode::Verified)
        };
        Route {
            decision,
            guard: Some(Guard { mode, subject }),
        }
    }
}

/// Why a request stays local (for debug logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReason {
    NonResource,
    AlreadyProxied,
    Invalid,
    ServedLocally,
    NotServedAnywhere,
    LocalDiscovery,
    /// No snapshot yet: nothing is known, so the local server answers and its type-404s are guarded.
    NoSnapshot,
}

/// Decides where a request goes. `pick(n)` returns a uniformly random index below `n`.
pub fn decide<'a>(
    req: &RequestFacts<'a>,
    table: Option<&Table>,
    merged_discovery: bool,
    pick: &mut dyn FnMut(usize) -> usize,
) -> Decision<'a> {
    decide_with(req, table, merged_discovery, pick, &mut |_| false)
}

/// [`route`]'s decision.
pub fn decide_with<'a>(
    req: &RequestFacts<'a>,
    table: Option<&Table>,
    merged_discovery: bool,
    pick: &mut dyn FnMut(usize) -> usize,
    is_down: &mut dyn FnMut(usize) -> bool,
) -> Decision<'a> {
    route(req, table, merged_discovery, pick, is_down).decision
}

/// [`decide`] with passive health, and the 404 guard's part: `is_down(i)` says whether a request to
/// `servers[i]` just failed to connect. It is asked only about peers that serve the request (and,
/// while the local server cannot answer, about any peer for a type nobody serves), so the common
/// paths cost nothing.
///
/// The order (local first, the 404 guarded):
/// 1. `x-kubernetes-peer-proxied: true` → local (loop prevention);
/// 2. merged discovery → the merged document, if the local server's own part is known (else the
///    local answer: discovery trouble never fails closed);
/// 3. the local server is known to serve it and answers discovery → local, strict if a peer serves
///    it too or some member's API set is unknown, else verified;
/// 4. a fresh, reachable peer serves it → that peer (a random one of them), strict;
/// 5. the local server is known to serve it (but did not answer its last round) → local, as in 3;
/// 6. only unreachable or stale members serve it → 503;
/// 7. nobody is known to serve it → local, strict while some member's API set is unknown, else
///    verified; while the local server is not ready (or did not answer its last round), a fresh,
///    reachable peer instead, guarded the same way. The client's connection stays with this
///    node's Envoy, so without it every such request fails until the local server is back (the
///    real node: 30 s of Envoy's 503s during a kube-apiserver upgrade, beyond client-go's
///    retries); through an apiserver with a built-in proxy the client would have reconnected to
///    another server and got that server's answer.
pub fn route<'a>(
    req: &RequestFacts<'a>,
    table: Option<&Table>,
    merged_discovery: bool,
    pick: &mut dyn FnMut(usize) -> usize,
    is_down: &mut dyn FnMut(usize) -> bool,
) -> Route<'a> {
    // Upstream checks the header after `IsResourceRequest`; both end local, and this one needs no
    // parse, so it comes first.
    if already_proxied(req) {
        return Route::stands(Decision::Local(LocalReason::AlreadyProxied));
    }
    // `apirequest.RequestInfoFrom`. A path with escapes is decoded into a buffer of this call, so
    // its subject is copied out of it; any other borrows the request's path.
    let subject = match request_info::parse_undecoded(req.method, req.path) {
        Some(kind) => subject(&kind, req, table, merged_discovery),
        None => {
            let mut decoded = String::new();
            let kind = request_info::parse_decoded(req.method, req.path, &mut decoded);
            subject(&kind, req, table, merged_discovery).map(Subject::into_owned)
        }
    };
    let subject = match subject {
        Ok(subject) => subject,
        Err(decision) => return Route::stands(decision),
    };
    let Some(table) = table else {
        return not_synced(subject);
    };
    serve_or_proxy(subject, table, pick, is_down)
}

/// Step 1, upstream's `r.Header.Get(PeerProxiedHeader) == "true"`: a forwarded request (or a
/// discovery fetch from a peer's proxy) is always served by the local apiserver with its own view.
fn already_proxied(req: &RequestFacts) -> bool {
    req.peer_proxied.is_some_and(|v| v == "true")
}

/// Upstream's `!requestInfo.IsResourceRequest`, widened: what a request is about, or (`Err`) its
/// decision, which stands, when it is not routed by the table: an invalid path, a non-resource path, and `/api` and
/// `/apis` (step 2, [`root_discovery`]). Discovery documents of a group or group/version are routed
/// like resources (upstream serves them locally).
fn subject<'k>(
    kind: &RequestKind<'k>,
    req: &RequestFacts,
    table: Option<&Table>,
    merged_discovery: bool,
) -> Result<Subject<'k>, Decision<'static>> {
    match kind {
        RequestKind::Invalid => Err(Decision::Local(LocalReason::Invalid)),
        RequestKind::NonResource(nr @ (NonResource::ApisRoot | NonResource::ApiRoot)) => {
            Err(root_discovery(nr, req, table, merged_discovery))
        }
        _ => Subject::of(kind).ok_or(Decision::Local(LocalReason::NonResource)),
    }
}

/// Upstream's `!h.HasFinishedSync()`: no snapshot yet, nothing is known, so the local server
/// answers and its type-404s are strict.
fn not_synced(subject: Subject<'_>) -> Route<'_> {
    Route::local(LocalReason::NoSnapshot, true, subject)
}

/// Steps 3 to 7: upstream's `shouldServeLocally`, `findServiceableByPeerFromPeerDiscoveryCache`,
/// `resolveServingLocation` and `rand.Intn`, on the request's own table key and then (for a
/// subresource nobody is known to serve) its parent's.
fn serve_or_proxy<'a>(
    subject: Subject<'a>,
    table: &Table,
    pick: &mut dyn FnMut(usize) -> usize,
    is_down: &mut dyn FnMut(usize) -> bool,
) -> Route<'a> {
    let local = table.local_mask();
    let incomplete = table.incomplete(&subject.gvr.group, &subject.gvr.version);
    let (local_key, fallback_key) = subject.keys();
    let own = table.servers_for_key(&local_key);
    let parent = fallback_key.filter(|_| own == 0).map(|k| table.servers_for_key(&k));
    for (nth, servers) in std::iter::once(own).chain(parent).enumerate() {
        if servers == 0 {
            continue;
        }
        // On the parent of a subresource nobody serves, a 404 is about that subresource: peers
        // serving the parent do not make it false.
        let strict = incomplete || (nth == 0 && servers & !local != 0);
        if serves_locally(table, servers) {
            return Route::local(LocalReason::ServedLocally, strict, subject);
        }
        if let Some(index) = pick_peer(table, servers, &subject, pick, is_down) {
            return Route::peer(index, true, subject);
        }
        // Step 5: the local server is known to serve it, though it did not answer its last round.
        if servers & local != 0 {
            return Route::local(LocalReason::ServedLocally, strict, subject);
        }
        // Step 6, upstream's `resolveServingLocation` error: 503.
        return Route::stands(Decision::Unavailable { gvr: subject.gvr });
    }
    // Step 7, upstream's "gvr %v is not served by anything in this cluster": local, or a peer
    // while the local server cannot answer.
    if !local_answers(table) {
        if let Some(index) = pick_peer(table, table.members(), &subject, pick, is_down) {
            return Route::peer(index, incomplete, subject);
        }
    }
    Route::local(LocalReason::NotServedAnywhere, incomplete, subject)
}

/// Step 3, upstream's `shouldServeLocally`: the local server serves it and answers discovery. Its
/// data is trusted only while it answers: right after it restarts (perhaps as another version) its
/// old data may claim resources it no longer serves.
fn serves_locally(table: &Table, servers: u64) -> bool {
    servers & table.local_mask() != 0 && local_answers(table)
}

/// The local server answered its last round and its last readiness probe.
fn local_answers(table: &Table) -> bool {
    table.local_mask() & table.unhealthy == 0
}

/// Step 4, upstream's `findServiceableByPeerFromPeerDiscoveryCache` then `rand.Intn`: a random one
/// of the fresh, reachable peers that serve it and are not marked down by passive health.
fn pick_peer(
    table: &Table,
    servers: u64,
    subject: &Subject,
    pick: &mut dyn FnMut(usize) -> usize,
    is_down: &mut dyn FnMut(usize) -> bool,
) -> Option<usize> {
    let routable = table.fresh(&subject.gvr.group) & !table.local_mask() & !table.unhealthy;
    let mut healthy = 0u64;
    for i in bits(servers & routable) {
        if !is_down(i) {
            healthy |= snapshot::bit(i);
        }
    }
    let count = healthy.count_ones() as usize;
    let nth = count.checked_sub(1).map(|last| pick(count).min(last))?;
    bits(healthy).nth(nth)
}

/// Step 2: `/api` and `/apis`.
fn root_discovery(
    nr: &NonResource,
    req: &RequestFacts,
    table: Option<&Table>,
    merged_discovery: bool,
) -> Decision<'static> {
    let is_get = req.method.eq_ignore_ascii_case("GET");
    if !(is_get && merged_discovery) {
        return Decision::Local(LocalReason::LocalDiscovery);
    }
    let doc = match (nr, accept::negotiate(req.accept)) {
        (_, DiscoveryChoice::Local) | (NonResource::ApiRoot, DiscoveryChoice::MergedLegacy) => {
            return Decision::Local(LocalReason::LocalDiscovery)
        }
        (NonResource::ApiRoot, _) => MergedDoc::Api,
        (_, DiscoveryChoice::Merged) => MergedDoc::Apis,
        (_, DiscoveryChoice::MergedLegacy) => MergedDoc::ApisLegacy,
    };
    // The merged document replaces the local answer only if it contains the local server's own
    // part; otherwise the local answer is the better one.
    let local_known = table.is_some_and(|t| {
        let known = if doc == MergedDoc::Api {
            t.known_core
        } else {
            t.known_groups
        };
        t.local_mask() & known != 0
    });
    if !local_known {
        return Decision::Local(LocalReason::LocalDiscovery);
    }
    Decision::Merged(doc)
}

/// The indexes of the set bits, lowest first (one step per set bit, not per bit).
fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let i = mask.trailing_zeros();
        if i >= 64 {
            return None;
        }
        mask &= mask - 1;
        Some(i as usize)
    })
}
