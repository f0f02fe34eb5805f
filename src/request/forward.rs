//! The request headers the filter sets or removes before the request goes on, decided here and
//! written by the adapter: the routing headers only this filter may set (every client copy is
//! removed), the headers that send a request to a peer, and the `If-None-Match` a merged discovery
//! request must not pass to the local server.

use crate::config::Config;
use crate::snapshot::ServerRef;
use crate::PEER_PROXIED_HEADER;

/// The headers that choose a cluster or an address: the route header and, in lease mode, the
/// address header. Only this filter may set them, so a client's copies are removed first.
pub fn routing_headers(config: &Config) -> impl Iterator<Item = &str> {
    let address_header = config.lease_discovery.as_ref().map(|l| l.address_header.as_str());
    std::iter::once(config.route_header.as_str()).chain(address_header)
}

/// How a request is sent to a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToPeer<'a> {
    /// These request headers, in order: the address (a lease peer), the cluster, and
    /// `x-kubernetes-peer-proxied: true`. Every request-header change through the ABI clears
    /// Envoy's route cache (`source/extensions/common/wasm/context.cc`, `replaceHeaderMapValue`), so
    /// the router re-picks the route by the cluster header; no extra foreign call.
    Headers(Vec<(&'a str, &'a str)>),
    /// The snapshot names a cluster our own configuration does not know (Envoy would 503): the
    /// request stays with the local server, unguarded, as before any routing.
    UnknownCluster,
    /// A peer learned from a lease, without lease mode configured here: only addresses learned
    /// from leases are ever written, so the request stays local, as above.
    NoAddressHeader,
}

/// The headers that send a request to `server`.
pub fn to_peer<'a>(config: &'a Config, server: &'a ServerRef) -> ToPeer<'a> {
    if !config.clusters().any(|c| c == server.cluster) {
        return ToPeer::UnknownCluster;
    }
    let mut headers = Vec::with_capacity(3);
    if let Some(address) = &server.address {
        // Lease peers share one address-picked cluster.
        let Some(l) = &config.lease_discovery else {
            return ToPeer::NoAddressHeader;
        };
        headers.push((l.address_header.as_str(), address.as_str()));
    }
    headers.push((config.route_header.as_str(), server.cluster.as_str()));
    headers.push((PEER_PROXIED_HEADER, "true"));
    ToPeer::Headers(headers)
}

/// A merged discovery request: the client's `If-None-Match` is removed (and kept for the merged
/// answer), so the local server answers in full, not 304 on its own ETag.
pub const MERGED_REQUEST_DROPS: &str = "if-none-match";

/// A merged discovery request: `Accept-Encoding` is removed too, so the local server's answer, whose
/// body is replaced, is not gzipped (kube-apiserver gzips a body over 128 KiB for a client that
/// accepts it: an `/apis` of a few hundred CRDs). The merged answer goes out uncompressed.
pub const MERGED_REQUEST_DROPS_ENCODING: &str = "accept-encoding";
