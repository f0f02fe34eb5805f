//! The routing decision, in the order of upstream `peerproxy_handler.go` `WrapHandler` plus the
//! differences we choose on purpose (503 before the first snapshot instead of a possible false
//! 404, subresource-aware routing, peer-aggregated `/api`, forwarding per-group discovery).

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
    /// Let the request continue to the local apiserver.
    Local(LocalReason),
    /// Send to `servers[index]` of the table.
    Peer { index: usize, gvr: Gvr },
    /// No snapshot yet: 503 with Retry-After.
    NotReady,
    /// Only unreachable peers serve it: 503 with Retry-After rather than a false 404.
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
    // A snapshot in which no server has answered yet (or all have gone stale) knows nothing:
    // routing on it would turn every peer-only resource into a false 404.
    let table = table.filter(|t| !t.servers.is_empty());
    let kind = request_info::parse(req.method, req.path);
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
                if table.is_none() {
                    return Decision::NotReady;
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
        return Decision::NotReady;
    };
    let local = table.local_mask();
    // The local server's data is trusted only while it answers discovery: right after it restarts
    // (perhaps as another version) its old data may claim resources it no longer serves.
    let local_trusted = local & !table.unhealthy;
    for key in std::iter::once(&local_key).chain(fallback_key.as_ref()) {
        let servers = table.servers_for(key);
        if servers == 0 {
            continue;
        }
        if servers & local_trusted != 0 {
            return Decision::Local(LocalReason::ServedLocally);
        }
        let healthy: Vec<usize> = bits(servers & !local & !table.unhealthy)
            .filter(|i| !is_down(*i))
            .collect();
        if let Some(nth) = healthy.len().checked_sub(1).map(|last| pick(healthy.len()).min(last)) {
            let index = healthy.get(nth).copied().unwrap_or(0);
            return Decision::Peer { index, gvr };
        }
        if servers & local != 0 {
            return Decision::Local(LocalReason::ServedLocally);
        }
        return Decision::Unavailable { gvr };
    }
    // Nobody is known to serve it. While some server cannot be asked, its API set may have changed
    // (e.g. it is being upgraded): a 503 the client retries, not a 404 it believes.
    if table.unhealthy != 0 {
        return Decision::Unavailable { gvr };
    }
    Decision::Local(LocalReason::NotServedAnywhere)
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
