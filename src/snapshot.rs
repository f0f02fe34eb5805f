//! The serving table: which fresh server serves which group/version/resource[/subresource].
//!
//! The discovery service builds it once per change and publishes it to Envoy shared data; each
//! filter VM decodes it only when the generation changes, so the per-request cost is one hash
//! lookup regardless of the table's size.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::discovery::GroupDiscovery;

/// Shared-data keys. Values are written table/documents first and generation last.
pub const KEY_GENERATION: &str = "kube-peer-proxy.v1/generation";
pub const KEY_TABLE: &str = "kube-peer-proxy.v1/table";
pub const KEY_MERGED_APIS: &str = "kube-peer-proxy.v1/merged/apis";
pub const KEY_MERGED_API: &str = "kube-peer-proxy.v1/merged/api";
pub const KEY_MERGED_APIS_LEGACY: &str = "kube-peer-proxy.v1/merged/apis-legacy";

/// Passive health: a filter that could not connect to a peer's cluster writes the time (ms) here;
/// the discovery service clears it (writes `0`) when that peer answers a discovery round again.
pub fn down_key(cluster: &str) -> String {
    format!("kube-peer-proxy.v1/down/{cluster}")
}

/// At most this many servers fit in a table (one bit each).
pub const MAX_SERVERS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRef {
    pub name: String,
    pub cluster: String,
    pub local: bool,
}

/// One server's discovery, as last fetched successfully.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerDiscovery {
    /// Items of `/api` (the core group has an empty name).
    pub core: Vec<GroupDiscovery>,
    /// Items of `/apis`.
    pub groups: Vec<GroupDiscovery>,
}

/// The decoded table a filter routes with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Table {
    pub generation: u64,
    /// When the discovery service built it (ms since the epoch); exported as snapshot age.
    pub built_ms: u64,
    pub servers: Vec<ServerRef>,
    /// Key (see [`resource_key`] and friends) → bit set of server indices.
    pub keys: HashMap<String, u64>,
    /// Servers (bit set) whose last discovery fetch could not reach them: still known to serve
    /// their resources (so those are never a false 404), but not routed to.
    #[serde(default)]
    pub unhealthy: u64,
    pub apis_etag: String,
    pub api_etag: String,
    #[serde(default)]
    pub apis_legacy_etag: String,
}

pub fn resource_key(group: &str, version: &str, resource: &str) -> String {
    format!("r/{group}/{version}/{resource}")
}

pub fn subresource_key(group: &str, version: &str, resource: &str, sub: &str) -> String {
    format!("s/{group}/{version}/{resource}/{sub}")
}

pub fn version_key(group: &str, version: &str) -> String {
    format!("v/{group}/{version}")
}

pub fn group_key(group: &str) -> String {
    format!("g/{group}")
}

impl Table {
    /// Builds the table from the fresh servers, in the order given (local first by convention).
    pub fn build(servers: &[(ServerRef, &ServerDiscovery)]) -> Table {
        let mut keys: BTreeMap<String, u64> = BTreeMap::new();
        for (i, (_, disc)) in servers.iter().enumerate().take(MAX_SERVERS) {
            let bit = 1u64 << i;
            for g in disc.core.iter().chain(disc.groups.iter()) {
                let group = g.metadata.name.as_str();
                for v in g.versions.iter().filter(|v| !v.is_stale()) {
                    *keys.entry(group_key(group)).or_default() |= bit;
                    *keys.entry(version_key(group, &v.version)).or_default() |= bit;
                    for r in &v.resources {
                        *keys.entry(resource_key(group, &v.version, &r.resource)).or_default() |= bit;
                        for s in &r.subresources {
                            let k = subresource_key(group, &v.version, &r.resource, &s.subresource);
                            *keys.entry(k).or_default() |= bit;
                        }
                    }
                }
            }
        }
        Table {
            generation: 0,
            built_ms: 0,
            servers: servers.iter().take(MAX_SERVERS).map(|(s, _)| s.clone()).collect(),
            keys: keys.into_iter().collect(),
            unhealthy: 0,
            apis_etag: String::new(),
            api_etag: String::new(),
            apis_legacy_etag: String::new(),
        }
    }

    /// Servers (bit set) that serve `key`; 0 when nobody does.
    pub fn servers_for(&self, key: &str) -> u64 {
        self.keys.get(key).copied().unwrap_or(0)
    }

    /// Bit of the local server, or 0 if the local server has no fresh data.
    pub fn local_mask(&self) -> u64 {
        self.servers
            .iter()
            .position(|s| s.local)
            .map(|i| 1u64 << i)
            .unwrap_or(0)
    }

    pub fn encode(&self) -> Vec<u8> {
        // BTreeMap for a deterministic encoding (fingerprints and tests compare bytes).
        #[derive(Serialize)]
        struct Enc<'a> {
            generation: u64,
            built_ms: u64,
            servers: &'a [ServerRef],
            keys: BTreeMap<&'a str, u64>,
            unhealthy: u64,
            apis_etag: &'a str,
            api_etag: &'a str,
            apis_legacy_etag: &'a str,
        }
        serde_json::to_vec(&Enc {
            generation: self.generation,
            built_ms: self.built_ms,
            servers: &self.servers,
            keys: self.keys.iter().map(|(k, v)| (k.as_str(), *v)).collect(),
            unhealthy: self.unhealthy,
            apis_etag: &self.apis_etag,
            api_etag: &self.api_etag,
            apis_legacy_etag: &self.apis_legacy_etag,
        })
        .unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Table, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// A merged document as stored in shared data: `<generation>\n<document>`, so a reader can tell
/// that it belongs to the table it decoded without hashing megabytes.
pub fn tag(generation: u64, document: &[u8]) -> Vec<u8> {
    let mut out = format!("{generation}\n").into_bytes();
    out.extend_from_slice(document);
    out
}

/// The document of a [`tag`]ged value if it belongs to `generation`.
pub fn untag(generation: u64, mut value: Vec<u8>) -> Option<Vec<u8>> {
    let newline = value.iter().position(|b| *b == b'\n')?;
    let prefix = std::str::from_utf8(value.get(..newline)?).ok()?;
    if prefix.parse::<u64>().ok()? != generation {
        return None;
    }
    value.drain(..=newline);
    Some(value)
}

/// 128-bit FNV-1a as a quoted upper-case hex ETag; the wasm has no crypto crate and the ETag only
/// needs to change when the document does.
pub fn etag(body: &[u8]) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for b in body {
        h ^= u128::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    format!("\"{h:032X}\"")
}
