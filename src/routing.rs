//! The routing decision, in the order of upstream `peerproxy_handler.go` `WrapHandler`
//! (`staging/src/k8s.io/apiserver/pkg/util/peerproxy/peerproxy_handler.go`) plus the differences we
//! choose on purpose: membership separate from freshness, the local server first with its
//! type-404 guarded while a 404 might be false, subresource-aware routing, peer-aggregated `/api`,
//! and forwarding per-group discovery.

use crate::accept::{self, DiscoveryChoice};
use crate::request_info::{self, NonResource, RequestKind};
use crate::snapshot::{self, Table};

pub const PEER_PROXIED_HEADER: &str = "x-kubernetes-peer-proxied";

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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Let the request continue to the local apiserver; its answer stands.
    Local(LocalReason),
    /// Let the request continue to the local apiserver, but a 404 meaning "this resource type is
    /// not served here" (see [`crate::not_found`]) becomes a 503: a peer is known to serve it, or
    /// some member's API set is unknown, so that 404 might be false.
    Guarded { reason: LocalReason, gvr: Gvr },
    /// Send to `servers[index]` of the table (its type-404 is guarded the same way: the table said
    /// it serves the resource).
    Peer { index: usize, gvr: Gvr },
    /// Only unreachable members, or members whose data is stale, serve it: 503 with Retry-After
    /// rather than a false 404.
    Unavailable { gvr: Gvr },
    /// Answer with the merged discovery document.
    Merged(MergedDoc),
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

/// Whether the decision can depend on `Accept`: only for `/api` and `/apis` (merged discovery), which
/// have at most one path segment (a trailing slash or a query aside). A path with an escape is
/// answered `true` too (`%2F` decodes to a separator). Every other request is decided without
/// `Accept`, so the filter does not read that header for it.
pub fn needs_accept(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or("");
    path.contains('%') || path.split('/').filter(|s| !s.is_empty()).count() <= 1
}

/// Decides where a request goes. `pick(n)` returns a uniformly random index below `n`.
pub fn decide(
    req: &RequestFacts,
    table: Option<&Table>,
    merged_discovery: bool,
    pick: &mut dyn FnMut(usize) -> usize,
) -> Decision {
    decide_with(req, table, merged_discovery, pick, &mut |_| false)
}

/// [`decide`] with passive health: `is_down(i)` says whether a request to `servers[i]` just failed
/// to connect. It is asked only about peers that serve the request, so the common paths cost nothing.
///
/// The order (local first, the 404 guarded):
/// 1. `x-kubernetes-peer-proxied: true` → local (loop prevention);
/// 2. merged discovery → the merged document, if the local server's own part is known (else the
///    local answer: discovery trouble never fails closed);
/// 3. the local server is known to serve it and answers discovery → local, guarded if a peer serves
///    it too or some member's API set is unknown;
/// 4. a fresh, reachable peer serves it → that peer (a random one of them);
/// 5. the local server is known to serve it (but did not answer its last round) → local, guarded;
/// 6. only unreachable or stale members serve it → 503;
/// 7. nobody is known to serve it → local, guarded while some member's API set is unknown (else its
///    404 is genuine).
pub fn decide_with(
    req: &RequestFacts,
    table: Option<&Table>,
    merged_discovery: bool,
    pick: &mut dyn FnMut(usize) -> usize,
    is_down: &mut dyn FnMut(usize) -> bool,
) -> Decision {
    // Loop prevention first: a forwarded request (or a discovery fetch from a peer's proxy) is
    // always served by the local apiserver with its own view.
    if req.peer_proxied.is_some_and(|v| v == "true") {
        return Decision::Local(LocalReason::AlreadyProxied);
    }
    let mut decoded = String::new();
    let kind = request_info::parse_decoded(req.method, req.path, &mut decoded);
    let is_get = req.method.eq_ignore_ascii_case("GET");
    let (local_key, fallback_key, gvr) = match &kind {
        RequestKind::Invalid => return Decision::Local(LocalReason::Invalid),
        RequestKind::NonResource(nr) => match nr {
            NonResource::ApisRoot | NonResource::ApiRoot => {
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
                // The merged document replaces the local answer only if it contains the local
                // server's own part; otherwise the local answer is the better one.
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
                return Decision::Merged(doc);
            }
            NonResource::CoreVersion(v) => (snapshot::version_key("", v), None, gv("", v)),
            NonResource::Group(g) => (snapshot::group_key(g), None, gv(g, "")),
            NonResource::GroupVersion(g, v) => (snapshot::version_key(g, v), None, gv(g, v)),
            NonResource::Other => return Decision::Local(LocalReason::NonResource),
        },
        RequestKind::Resource(r) => {
            let gvr = Gvr {
                group: r.group.to_string(),
                version: r.version.to_string(),
                resource: r.resource.to_string(),
            };
            let rkey = snapshot::resource_key(r.group, r.version, r.resource);
            if r.subresource.is_empty() {
                (rkey, None, gvr)
            } else {
                let skey = snapshot::subresource_key(r.group, r.version, r.resource, r.subresource);
                (skey, Some(rkey), gvr)
            }
        }
    };
    let Some(table) = table else {
        return Decision::Guarded {
            reason: LocalReason::NoSnapshot,
            gvr,
        };
    };
    let local = table.local_mask();
    let incomplete = table.incomplete(&gvr.group, &gvr.version);
    let guarded = |reason, peers_serve: bool, gvr: Gvr| {
        if peers_serve || incomplete {
            Decision::Guarded { reason, gvr }
        } else {
            Decision::Local(reason)
        }
    };
    let routable = table.fresh(&gvr.group) & !local & !table.unhealthy;
    for (nth, key) in std::iter::once(&local_key).chain(fallback_key.as_ref()).enumerate() {
        let servers = table.servers_for(key);
        if servers == 0 {
            continue;
        }
        // On the parent of a subresource nobody serves, a 404 is about that subresource: peers
        // serving the parent do not make it false.
        let peers_serve = nth == 0 && servers & !local != 0;
        // The local server's data is trusted only while it answers discovery: right after it
        // restarts (perhaps as another version) its old data may claim resources it no longer serves.
        if servers & local & !table.unhealthy != 0 {
            return guarded(LocalReason::ServedLocally, peers_serve, gvr);
        }
        let healthy: Vec<usize> = bits(servers & routable).filter(|i| !is_down(*i)).collect();
        if let Some(nth) = healthy.len().checked_sub(1).map(|last| pick(healthy.len()).min(last)) {
            let index = healthy.get(nth).copied().unwrap_or(0);
            return Decision::Peer { index, gvr };
        }
        if servers & local != 0 {
            return guarded(LocalReason::ServedLocally, peers_serve, gvr);
        }
        return Decision::Unavailable { gvr };
    }
    guarded(LocalReason::NotServedAnywhere, false, gvr)
}
fn bits(mask: u64) -> impl Iterator<Item = usize> {
    (0..64usize).filter(move |i| mask & (1u64 << i) != 0)
}

fn gv(group: &str, version: &str) -> Gvr {
    Gvr {
        group: group.to_string(),
        version: version.to_string(),
        resource: String::new(),
    }
}
