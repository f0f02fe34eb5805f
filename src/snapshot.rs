//! The serving table: which member server was last seen to serve which
//! group/version/resource[/subresource], and how much of each member's API set is known, fresh and
//! reachable (membership is separate from freshness: a member never leaves because it is down).
//!
//! The discovery service builds it once per change and publishes it to Envoy shared data: the
//! small head (members, bit sets, ETags) under [`KEY_TABLE`], and the keys in hash buckets of
//! about [`KEYS_PER_BUCKET`] keys each ([`bucket_key`]). A filter VM decodes only the head when a
//! snapshot is published and reads the one bucket a lookup needs straight from shared data (then
//! remembers the answer for that head, [`crate::entry_cache`]), so no worker VM holds the table:
//! memory does not grow with Envoy's worker count, and a lookup costs the same for any table size.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::discovery::documents::GroupDiscovery;
use crate::entry_cache::EntryCache;
use crate::request::routing::MergedDoc;

/// Shared-data keys. Values are written table/documents first and generation last.
pub const KEY_GENERATION: &str = "kube-peer-proxy.v1/generation";
/// Written (empty) after the generation key whenever a snapshot is published: its CAS (the host's
/// counter of writes) tells a worker that something was published since it last looked. A worker
/// reads it on every request: an empty value costs no copy into the VM and a key of 15 bytes or
/// fewer no allocation in the host (proxy-wasm-cpp-host `SharedData::get`), so a request sees the
/// newest snapshot for the price of one cheap host call.
pub const KEY_PUBLISHED: &str = "kpp.v1/publish";
/// The table's head: everything but the keys, which are in buckets of their own ([`bucket_key`]).
pub const KEY_TABLE: &str = "kube-peer-proxy.v1/table";
/// Prefix of the table's key buckets.
pub const KEY_ENTRY_PREFIX: &str = "kube-peer-proxy.v1/k";
pub const KEY_MERGED_APIS: &str = "kube-peer-proxy.v1/merged/apis";
pub const KEY_MERGED_API: &str = "kube-peer-proxy.v1/merged/api";
pub const KEY_MERGED_APIS_LEGACY: &str = "kube-peer-proxy.v1/merged/apis-legacy";

/// A merged document up to this size is published whole and every worker keeps a copy (a fast
/// answer for a small cluster). A larger one is published in [`CHUNK`]-sized pieces that a worker
/// copies into the response one at a time, so no worker VM holds it: wasm linear memory never
/// shrinks, so a copy stays resident per worker, and Envoy's allocator keeps the host's copy of it
/// in each worker thread's cache. With 1 MiB here, the 109 KB legacy `/apis` of 20 000 CRD
/// resources cost about 7 MiB at 32 workers (`make bench`'s worker sweep).
pub const WHOLE_LIMIT: usize = 64 << 10;
/// Piece size of a chunked document (see [`chunk_key`]).
pub const CHUNK: usize = 256 << 10;

/// Where piece `index` of the document at `key` lives for `generation`. Two slots, by the
/// generation's parity: the service overwrites the slot of the generation before last, so a worker
/// still answering from its previous table finds that table's pieces intact. Each piece starts
/// with its generation's [`tag`], so a piece from another generation is recognized.
pub fn chunk_key(key: &str, generation: u64, index: usize) -> String {
    format!("{key}/{}/{index}", generation % 2)
}

/// How many pieces a chunked document of `len` bytes has.
pub fn chunk_count(len: u64) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX).div_ceil(CHUNK)
}

/// Whether a merged document of `len` bytes is published in pieces.
pub fn is_chunked(len: u64) -> bool {
    usize::try_from(len).map_or(true, |l| l > WHOLE_LIMIT)
}

/// At most this many servers fit in a table (one bit each).
pub const MAX_SERVERS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRef {
    pub name: String,
    pub cluster: String,
    pub local: bool,
    /// `ip:port` of a peer learned from an identity lease, reached through the one address-picked
    /// (`ORIGINAL_DST`) cluster; `None` for configured servers, which have a cluster each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl ServerRef {
    /// What identifies where requests to this server go: its address if it has one, else its cluster.
    pub fn target(&self) -> &str {
        self.address.as_deref().unwrap_or(&self.cluster)
    }
}

/// One member's state as the table is built from it.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub server: ServerRef,
    /// `/api`'s groups as last learned; `None` if never learned.
    pub core: Option<&'a [GroupDiscovery]>,
    /// `/apis`'s groups as last learned; `None` if never learned.
    pub groups: Option<&'a [GroupDiscovery]>,
    /// Group/versions a legacy walk listed but whose resources were never learned.
    pub unknown_versions: &'a [(String, String)],
    pub fresh_core: bool,
    pub fresh_groups: bool,
    /// Whether its last discovery round could connect.
    pub reachable: bool,
}

/// One server's discovery, as last fetched successfully.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerDiscovery {
    /// Items of `/api` (the core group has an empty name).
    pub core: Vec<GroupDiscovery>,
    /// Items of `/apis`.
    pub groups: Vec<GroupDiscovery>,
}

/// The decoded table a filter routes with. Bit sets are indexed like `servers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Table {
    pub generation: u64,
    /// When the discovery service built it (ms since the epoch); exported as snapshot age.
    pub built_ms: u64,
    /// Every member, whether or not its API set is known.
    pub servers: Vec<ServerRef>,
    /// Key (see [`resource_key`] and friends) → members last seen to serve it, however long ago.
    /// `u/<g>/<v>` and `u/<g>` keys ([`unknown_key`]) list members whose resources there are unknown.
    /// Empty in a filter VM's head, which reads them from shared data (see [`KeySource`]).
    #[serde(default)]
    pub keys: BTreeMap<String, u64>,
    /// The entry slot (0 or 1) and version of the published keys (see [`bucket_key`]).
    #[serde(default)]
    pub keys_slot: u8,
    #[serde(default)]
    pub keys_version: u64,
    /// How many buckets the published keys are hashed into ([`bucket_count`] of the key count).
    #[serde(default)]
    pub keys_buckets: u32,
    /// Where [`Table::servers_for`] looks keys up.
    #[serde(skip)]
    pub key_source: KeySource,
    /// What a filter VM looked up lately in shared data (see [`EntryCache`]).
    #[serde(skip)]
    pub looked_up: EntryCache,
    /// Members whose `/api` (core group) has been learned at least once.
    #[serde(default)]
    pub known_core: u64,
    /// Members whose `/apis` has been learned at least once.
    #[serde(default)]
    pub known_groups: u64,
    /// Members whose `/api` data is within `staleness_limit` (only these are routed to).
    #[serde(default)]
    pub fresh_core: u64,
    #[serde(default)]
    pub fresh_groups: u64,
    /// Members whose last discovery round could not connect: still known to serve their resources
    /// (so those are never a false 404), but not routed to.
    #[serde(default)]
    pub unhealthy: u64,
    /// Lease mode before the first lease list: there may be members nobody knows of yet.
    #[serde(default)]
    pub membership_unknown: bool,
    pub apis_etag: String,
    pub api_etag: String,
    #[serde(default)]
    pub apis_legacy_etag: String,
    /// Byte lengths of the merged documents (`/apis`, `/api`, legacy `/apis`): above
    /// [`WHOLE_LIMIT`] a document is published in pieces (see [`chunks`]).
    #[serde(default)]
    pub merged_lengths: [u64; 3],
}

/// Where a table's keys are looked up: in the table (the discovery service, tests), or in shared
/// data through a reader (a filter VM, whose table is only the head).
#[derive(Debug, Clone, Copy, Default)]
pub enum KeySource {
    #[default]
    InTable,
    /// Reads one shared-data value: the host call in a filter VM, a map in tests.
    Shared(fn(&str) -> Option<Vec<u8>>),
}

impl PartialEq for KeySource {
    /// Two tables are equal by content; the reader is a means of lookup, not content.
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl Eq for KeySource {}

/// Keys per published bucket, on average. One shared-data entry per key cost Envoy about 200 bytes
/// of heap each beyond the key and value (a hash-map node and two strings): 8 MiB for a table of
/// 40 000 keys. A bucket of about 40 keys is one entry (1 024 entries for that table) and a lookup
/// copies one or two KB; workers look a key up in shared data only when they do not remember it
/// ([`crate::entry_cache`]), so a larger bucket costs a request nothing in the common case.
pub const KEYS_PER_BUCKET: usize = 40;

/// Buckets for `keys` keys: a power of two (a bucket is a mask of the key's hash), rounded down,
/// so a bucket holds between [`KEYS_PER_BUCKET`] and twice that many keys on average.
pub fn bucket_count(keys: usize) -> u32 {
    let n = (keys / KEYS_PER_BUCKET).clamp(1, 1 << 20);
    1u32 << (usize::BITS - 1 - n.leading_zeros())
}

/// The bucket of `key` among `buckets` (FNV-1a; the same in every VM, process and version).
pub fn bucket_of(key: &str, buckets: u32) -> u32 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    let mask = u64::from(buckets.max(1).next_power_of_two() - 1);
    u32::try_from(h & mask).unwrap_or(0)
}

/// The shared-data key of bucket `index` in entry slot `slot`. Two slots: a new key set is
/// written into the slot the current head does not use, before the head that points at it, so a
/// worker still routing with the previous head reads intact buckets. Buckets are never deleted
/// (the host has no delete): a bucket of an earlier key set keeps that set's version, which
/// [`bucket_lookup`] does not accept.
pub fn bucket_key(slot: u8, index: u32) -> String {
    // Written out rather than `format!`: a filter VM builds one per lookup it does not remember.
    let mut key = String::with_capacity(KEY_ENTRY_PREFIX.len() + 16);
    key.push_str(KEY_ENTRY_PREFIX);
    key.push('/');
    push_decimal(&mut key, u64::from(slot));
    key.push('/');
    push_decimal(&mut key, u64::from(index));
    key
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        if let Some(d) = digits.get_mut(at) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    for d in digits.iter().skip(at) {
        out.push(char::from(*d));
    }
}

/// A bucket's value: the key set's version (u64), then per key its length (u32), its bytes and its
/// members' bit set (u64), all little-endian, keys in order.
fn write_record(value: &mut Vec<u8>, key: &str, servers: u64) {
    value.extend_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_le_bytes());
    value.extend_from_slice(key.as_bytes());
    value.extend_from_slice(&servers.to_le_bytes());
}

/// The bit set of `key` in a bucket of key-set `version`: `None` if the bucket belongs to another
/// set or is damaged, `Some(0)` if the set does not have the key.
pub fn bucket_lookup(version: u64, value: &[u8], key: &str) -> Option<u64> {
    fn u64_at(b: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
    }
    if u64_at(value, 0)? != version {
        return None;
    }
    let mut at = 8usize;
    while at < value.len() {
        let len = u32::from_le_bytes(value.get(at..at.checked_add(4)?)?.try_into().ok()?);
        let start = at.checked_add(4)?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        let bits = u64_at(value, end)?;
        if value.get(start..end)? == key.as_bytes() {
            return Some(bits);
        }
        at = end.checked_add(8)?;
    }
    Some(0)
}

/// A table key: its parts joined by `/`, written into `buf` (cleared first).
fn key_into(buf: &mut String, parts: &[&str]) {
    buf.clear();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            buf.push('/');
        }
        buf.push_str(p);
    }
}

fn key(parts: &[&str]) -> String {
    let mut k = String::new();
    key_into(&mut k, parts);
    k
}

/// A table key by its parts, written out only into a buffer (see [`Table::servers_for_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    kind: &'static str,
    parts: [&'a str; 4],
    len: usize,
}

impl<'a> Key<'a> {
    /// [`group_key`]
    pub fn group(g: &'a str) -> Key<'a> {
        Key {
            kind: "g",
            parts: [g, "", "", ""],
            len: 1,
        }
    }

    /// [`version_key`]
    pub fn version(g: &'a str, v: &'a str) -> Key<'a> {
        Key {
            kind: "v",
            parts: [g, v, "", ""],
            len: 2,
        }
    }

    /// [`resource_key`]
    pub fn resource(g: &'a str, v: &'a str, r: &'a str) -> Key<'a> {
        Key {
            kind: "r",
            parts: [g, v, r, ""],
            len: 3,
        }
    }

    /// [`subresource_key`]
    pub fn subresource(g: &'a str, v: &'a str, r: &'a str, sub: &'a str) -> Key<'a> {
        Key {
            kind: "s",
            parts: [g, v, r, sub],
            len: 4,
        }
    }

    /// The first part of its text: what kind of key it is.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The parts after [`Key::kind`].
    pub fn parts(&self) -> &[&'a str] {
        self.parts.get(..self.len).unwrap_or(&[])
    }

    /// The key's text into `buf` (cleared first): `kind/part/part…`.
    pub fn write(&self, buf: &mut String) {
        buf.clear();
        buf.push_str(self.kind);
        for p in self.parts() {
            buf.push('/');
            buf.push_str(p);
        }
    }
}

pub fn resource_key(group: &str, version: &str, resource: &str) -> String {
    key(&["r", group, version, resource])
}

pub fn subresource_key(group: &str, version: &str, resource: &str, sub: &str) -> String {
    key(&["s", group, version, resource, sub])
}

pub fn version_key(group: &str, version: &str) -> String {
    key(&["v", group, version])
}

pub fn group_key(group: &str) -> String {
    key(&["g", group])
}

/// Adds `bit` to the key of `parts`, formatting it in a reused buffer: a key every member serves
/// is allocated once, not once per member and dropped again (in a wasm VM, whose linear memory
/// keeps every peak, the dropped copies left holes between the keys kept).
fn add_key(keys: &mut BTreeMap<String, u64>, buf: &mut String, parts: &[&str], bit: u64) {
    key_into(buf, parts);
    match keys.get_mut(buf.as_str()) {
        Some(bits) => *bits |= bit,
        None => {
            keys.insert(buf.as_str().to_owned(), bit);
        }
    }
}

/// Members whose resources in `group` (and `version`, if not empty) are unknown.
/// What every [`unknown_key`] starts with.
const UNKNOWN_PREFIX: &str = "u/";

pub fn unknown_key(group: &str, version: &str) -> String {
    if version.is_empty() {
        format!("{UNKNOWN_PREFIX}{group}")
    } else {
        format!("{UNKNOWN_PREFIX}{group}/{version}")
    }
}

/// The bit of `servers[i]` in a table's bit sets (0 past [`MAX_SERVERS`]).
pub fn bit(i: usize) -> u64 {
    1u64.checked_shl(u32::try_from(i).unwrap_or(u32::MAX)).unwrap_or(0)
}

impl Table {
    /// Builds the table from servers whose data is all known, fresh and reachable, in the order
    /// given (local first by convention). Tests and benchmarks use it; the syncer uses [`Table::build_members`].
    pub fn build(servers: &[(ServerRef, &ServerDiscovery)]) -> Table {
        let members: Vec<Member> = servers
            .iter()
            .map(|(s, d)| Member {
                server: s.clone(),
                core: Some(&d.core),
                groups: Some(&d.groups),
                unknown_versions: &[],
                fresh_core: true,
                fresh_groups: true,
                reachable: true,
            })
            .collect();
        Table::build_members(&members)
    }

    /// Builds the table from every member, in the order given.
    pub fn build_members(members: &[Member]) -> Table {
        let mut keys: BTreeMap<String, u64> = BTreeMap::new();
        let mut buf = String::new();
        let mut t = Table::default();
        for (i, m) in members.iter().enumerate().take(MAX_SERVERS) {
            let bit = bit(i);
            let parts = [
                (m.core, &mut t.known_core, &mut t.fresh_core, m.fresh_core),
                (m.groups, &mut t.known_groups, &mut t.fresh_groups, m.fresh_groups),
            ];
            for (docs, known, fresh, is_fresh) in parts {
                let Some(docs) = docs else { continue };
                *known |= bit;
                if is_fresh {
                    *fresh |= bit;
                }
                for g in docs {
                    let group = g.metadata.name.as_str();
                    for v in g.versions.iter().filter(|v| !v.is_stale()) {
                        let version = v.version.as_str();
                        add_key(&mut keys, &mut buf, &["g", group], bit);
                        add_key(&mut keys, &mut buf, &["v", group, version], bit);
                        for r in &v.resources {
                            add_key(&mut keys, &mut buf, &["r", group, version, &r.resource], bit);
                            for s in &r.subresources {
                                add_key(
                                    &mut keys,
                                    &mut buf,
                                    &["s", group, version, &r.resource, &s.subresource],
                                    bit,
                                );
                            }
                        }
                    }
                }
            }
            for (g, v) in m.unknown_versions {
                *keys.entry(unknown_key(g, v)).or_default() |= bit;
                *keys.entry(unknown_key(g, "")).or_default() |= bit;
                // Listed by the group list, so the member serves the group/version itself.
                *keys.entry(group_key(g)).or_default() |= bit;
                *keys.entry(version_key(g, v)).or_default() |= bit;
            }
            if !m.reachable {
                t.unhealthy |= bit;
            }
        }
        t.servers = members.iter().take(MAX_SERVERS).map(|m| m.server.clone()).collect();
        t.keys_buckets = bucket_count(keys.len());
        t.keys = keys;
        t
    }

    /// Every member (bit set).
    pub fn members(&self) -> u64 {
        match self.servers.len() {
            n if n >= 64 => u64::MAX,
            n => bit(n).wrapping_sub(1),
        }
    }

    /// Members whose API set for `group` (`""` is the core group) is learned.
    pub fn known(&self, group: &str) -> u64 {
        if group.is_empty() {
            self.known_core
        } else {
            self.known_groups
        }
    }

    /// Members whose data for `group` is within the staleness limit.
    pub fn fresh(&self, group: &str) -> u64 {
        if group.is_empty() {
            self.fresh_core
        } else {
            self.fresh_groups
        }
    }

    /// Whether some member's resources in `group`/`version` (`version` may be empty) are unknown,
    /// so a 404 there might be false.
    pub fn incomplete(&self, group: &str, version: &str) -> bool {
        self.membership_unknown
            || self.servers.is_empty()
            || self.members() & !self.known(group) != 0
            // No keys at all (a filter VM's head whose members' resources are all known): no `u/` key
            // either, and no key to format per request.
            || (!self.keys.is_empty() && self.servers_for(&unknown_key(group, version)) != 0)
    }

    /// Servers (bit set) that serve `key`; 0 when nobody does. A filter VM's head reads the
    /// entry from shared data (one host call; see [`bucket_key`]), or remembers it from an earlier
    /// request (see [`EntryCache`]).
    pub fn servers_for(&self, key: &str) -> u64 {
        match self.key_source {
            KeySource::InTable => self.keys.get(key).copied().unwrap_or(0),
            KeySource::Shared(_) if key.starts_with(UNKNOWN_PREFIX) => self.keys.get(key).copied().unwrap_or(0),
            KeySource::Shared(read) => self.looked_up.get_or_read(key, |key| self.read_bucket(read, key)),
        }
    }

    /// [`Table::servers_for`] of `key`: a filter VM looks it up by its parts in what it remembers
    /// ([`EntryCache`]), so a request routes without formatting its keys.
    pub fn servers_for_key(&self, key: &Key) -> u64 {
        match self.key_source {
            KeySource::Shared(read) => self.looked_up.get_or_read(key, |text| self.read_bucket(read, text)),
            KeySource::InTable => {
                let mut text = String::new();
                key.write(&mut text);
                self.servers_for(&text)
            }
        }
    }

    fn read_bucket(&self, read: fn(&str) -> Option<Vec<u8>>, key: &str) -> Option<u64> {
        read(&bucket_key(self.keys_slot, bucket_of(key, self.keys_buckets)))
            .and_then(|v| bucket_lookup(self.keys_version, &v, key))
    }

    /// The shared-data buckets of this table's keys (the `u/` keys stay in the head), for its
    /// slot, version and bucket count; empty buckets are not written (a missing bucket has no key).
    pub fn entries(&self) -> impl Iterator<Item = (String, Vec<u8>)> + '_ {
        let buckets = self.keys_buckets;
        // `&String`, not `&str`: a thin pointer keeps this 16 bytes a key in a wasm32 VM, and an
        // unstable sort needs no second buffer (keys are unique, so the order is still one).
        let mut keys: Vec<(u32, &String, u64)> = Vec::with_capacity(self.keys.len());
        keys.extend(
            self.keys
                .iter()
                .filter(|(k, _)| !k.starts_with(UNKNOWN_PREFIX))
                .map(|(k, v)| (bucket_of(k, buckets), k, *v)),
        );
        keys.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let mut rest = keys.into_iter().peekable();
        std::iter::from_fn(move || {
            let (index, key, servers) = rest.next()?;
            let mut value = self.keys_version.to_le_bytes().to_vec();
            write_record(&mut value, key, servers);
            while let Some((_, key, servers)) = rest.next_if(|(b, _, _)| *b == index) {
                write_record(&mut value, key, servers);
            }
            Some((bucket_key(self.keys_slot, index), value))
        })
    }

    /// A fingerprint of the keys and their bit sets: a new one means new entries to publish.
    pub fn keys_fingerprint(&self) -> String {
        let mut h = Fnv::default();
        for (k, v) in &self.keys {
            h.write(k.as_bytes());
            h.write(&[0]);
            h.write(&v.to_le_bytes());
        }
        h.etag()
    }

    /// Bit of the local server (0 if it is not a member, which only hand-built tables do).
    pub fn local_mask(&self) -> u64 {
        self.servers.iter().position(|s| s.local).map(bit).unwrap_or(0)
    }

    /// Drops the keys that are published as buckets once they are ([`Table::entries`]); the `u/`
    /// keys, which the head carries, stay. The discovery service writes the merged documents after
    /// the buckets, so their serialization reuses the keys' memory instead of adding to it.
    pub fn keep_head_keys_only(&mut self) {
        self.keys.retain(|k, _| k.starts_with(UNKNOWN_PREFIX));
    }

    /// The whole table, keys included (deterministic: fingerprints and tests compare bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(Some(&self.keys))
    }

    /// The head a filter VM decodes: everything but the resource and group keys, which it reads
    /// as entries. The few `u/` keys ([`unknown_key`]) stay in it: every resource request asks
    /// one, and in the head that costs no host call.
    pub fn encode_head(&self) -> Vec<u8> {
        let unknown: BTreeMap<String, u64> = self
            .keys
            .iter()
            .filter(|(k, _)| k.starts_with(UNKNOWN_PREFIX))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        self.encode_with(Some(&unknown))
    }

    /// `etag(&self.encode())`, hashed as it is serialized: the discovery service compares a new
    /// table with the last one without writing out megabytes of keys.
    pub fn fingerprint(&self) -> String {
        let mut h = Fnv::default();
        self.encode_to(Some(&self.keys), &mut |bytes| h.write(bytes));
        h.etag()
    }

    fn encode_with(&self, keys: Option<&BTreeMap<String, u64>>) -> Vec<u8> {
        let mut len = 0usize;
        self.encode_to(keys, &mut |bytes| len += bytes.len());
        // Exact size: a large table is not left in a buffer grown by doubling.
        let mut out = Vec::with_capacity(len);
        self.encode_to(keys, &mut |bytes| out.extend_from_slice(bytes));
        out
    }

    /// The JSON of the table with `keys`, handed to `sink` piece by piece.
    fn encode_to(&self, keys: Option<&BTreeMap<String, u64>>, sink: &mut dyn FnMut(&[u8])) {
        #[derive(Serialize)]
        struct Enc<'a> {
            generation: u64,
            built_ms: u64,
            servers: &'a [ServerRef],
            #[serde(skip_serializing_if = "Option::is_none")]
            keys: Option<&'a BTreeMap<String, u64>>,
            keys_slot: u8,
            keys_version: u64,
            keys_buckets: u32,
            known_core: u64,
            known_groups: u64,
            fresh_core: u64,
            fresh_groups: u64,
            unhealthy: u64,
            membership_unknown: bool,
            apis_etag: &'a str,
            api_etag: &'a str,
            apis_legacy_etag: &'a str,
            merged_lengths: [u64; 3],
        }
        let enc = Enc {
            generation: self.generation,
            built_ms: self.built_ms,
            servers: &self.servers,
            keys,
            keys_slot: self.keys_slot,
            keys_version: self.keys_version,
            keys_buckets: self.keys_buckets,
            known_core: self.known_core,
            known_groups: self.known_groups,
            fresh_core: self.fresh_core,
            fresh_groups: self.fresh_groups,
            unhealthy: self.unhealthy,
            membership_unknown: self.membership_unknown,
            apis_etag: &self.apis_etag,
            api_etag: &self.api_etag,
            apis_legacy_etag: &self.apis_legacy_etag,
            merged_lengths: self.merged_lengths,
        };
        // Serializing plain structs, maps and strings into a sink that never fails cannot fail.
        let _ = serde_json::to_writer(Sink(sink), &enc);
    }

    pub fn decode(bytes: &[u8]) -> Result<Table, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// The members' documents the merged documents are written from, in merge order (servers by
/// name): shared with the discovery service's state, not copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergedSource {
    /// `/apis` of every member that has one.
    pub apis: Vec<Rc<Vec<GroupDiscovery>>>,
    /// `/api` of every member that has one.
    pub core: Vec<Rc<Vec<GroupDiscovery>>>,
}

impl MergedSource {
    /// Writes merged document `doc` to `sink` piece by piece as it is serialized: the service
    /// publishes a large one straight into its shared-data pieces, so no VM ever holds it whole.
    pub fn write(&self, doc: MergedDoc, sink: &mut dyn FnMut(&[u8])) {
        use crate::discovery::{documents, merge};
        fn slices(docs: &[Rc<Vec<GroupDiscovery>>]) -> Vec<&[GroupDiscovery]> {
            docs.iter().map(|d| d.as_slice()).collect()
        }
        let mut w = Sink(sink);
        // A sink cannot fail; a serializer error (none for these types) would end the document
        // early, and its ETag, measured by the same writer, would say so.
        let _ = match doc {
            MergedDoc::Apis => documents::write_v2_json(&merge::merge_group_views(&slices(&self.apis)), &mut w),
            MergedDoc::Api => documents::write_v2_json(&merge::merge_group_views(&slices(&self.core)), &mut w),
            MergedDoc::ApisLegacy => documents::write_legacy_group_list(
                merge::merge_group_views(&slices(&self.apis))
                    .iter()
                    .map(documents::LegacyGroup::from)
                    .collect(),
                &mut w,
            ),
        };
    }

    /// `(length, ETag)` of merged document `doc`, hashed as it is written (nothing kept).
    pub fn measure(&self, doc: MergedDoc) -> (u64, String) {
        let (mut len, mut h) = (0u64, Fnv::default());
        self.write(doc, &mut |bytes| {
            len += bytes.len() as u64;
            h.write(bytes);
        });
        (len, h.etag())
    }

    /// Merged document `doc`, whole (small documents, tests and tools).
    pub fn document(&self, doc: MergedDoc) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(doc, &mut |bytes| out.extend_from_slice(bytes));
        out
    }
}

/// A `std::io::Write` over a closure that takes every byte.
struct Sink<'a>(&'a mut dyn FnMut(&[u8]));

impl std::io::Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (self.0)(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The three merged documents, in [`Table::merged_lengths`] order.
pub const MERGED_DOCS: [MergedDoc; 3] = [MergedDoc::Apis, MergedDoc::Api, MergedDoc::ApisLegacy];

/// Everything a filter needs, built from the members' state: the serving table (with the merged
/// documents' lengths and ETags) and where the merged documents are written from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub table: Table,
    pub merged: MergedSource,
    /// Whether the table's entries must be written: its key set is new (see [`bucket_key`]).
    pub keys_changed: bool,
}

impl Snapshot {
    /// Builds the table from `members` (in the order given: servers by name) and measures the
    /// documents merged from `merged` (the same members' documents, same order); generation and
    /// build time are the caller's. The merged documents are written only when published
    /// ([`MergedSource::write`]).
    pub fn build(members: &[Member], merged: MergedSource, membership_unknown: bool) -> Snapshot {
        // Measured before the keys exist: a merge's transient views and the table's keys are the
        // two large things a build makes, and the VM's linear memory keeps whatever peak they reach
        // together.
        let [apis, api, legacy] = MERGED_DOCS.map(|d| merged.measure(d));
        let mut table = Table::build_members(members);
        table.membership_unknown = membership_unknown;
        table.merged_lengths = [apis.0, api.0, legacy.0];
        (table.apis_etag, table.api_etag, table.apis_legacy_etag) = (apis.1, api.1, legacy.1);
        Snapshot {
            table,
            merged,
            keys_changed: true,
        }
    }

    /// Merged `/apis`, whole.
    pub fn merged_apis(&self) -> Vec<u8> {
        self.merged.document(MergedDoc::Apis)
    }

    /// Merged `/api`, whole.
    pub fn merged_api(&self) -> Vec<u8> {
        self.merged.document(MergedDoc::Api)
    }

    /// Merged `/apis` as a legacy `APIGroupList`, whole.
    pub fn merged_apis_legacy(&self) -> Vec<u8> {
        self.merged.document(MergedDoc::ApisLegacy)
    }
}

/// Writes a document to the sink it is given (e.g. [`MergedSource::write`] of one document).
pub type WriteDocument<'a> = dyn FnMut(&mut dyn FnMut(&[u8])) + 'a;

/// Writes a merged document of `len` bytes (as [`MergedSource::measure`]d) for `generation`
/// through `put(key, value)`: whole and tagged under `key` up to [`WHOLE_LIMIT`]; above it in
/// tagged [`CHUNK`] pieces under [`chunk_key`], each put as soon as it is full, then the tag alone
/// under `key`. `write` writes the document. False if a put failed or the document did not have
/// `len` bytes.
pub fn put_document(
    key: &str,
    generation: u64,
    len: u64,
    write: &mut WriteDocument,
    put: &mut dyn FnMut(&str, &[u8]) -> bool,
) -> bool {
    let tag = tag(generation);
    if !is_chunked(len) {
        let mut doc = Vec::with_capacity(usize::try_from(len).unwrap_or(0) + tag.len());
        doc.extend_from_slice(tag.as_bytes());
        write(&mut |bytes| doc.extend_from_slice(bytes));
        return doc.len() as u64 == len + tag.len() as u64 && put(key, &doc);
    }
    let (mut ok, mut index, mut written) = (true, 0usize, 0u64);
    let mut piece = Vec::with_capacity(tag.len() + CHUNK);
    piece.extend_from_slice(tag.as_bytes());
    write(&mut |mut bytes| {
        written += bytes.len() as u64;
        while !bytes.is_empty() {
            let room = CHUNK + tag.len() - piece.len();
            let (now, later) = bytes.split_at(room.min(bytes.len()));
            piece.extend_from_slice(now);
            bytes = later;
            if piece.len() == CHUNK + tag.len() {
                ok &= put(&chunk_key(key, generation, index), &piece);
                index += 1;
                piece.truncate(tag.len());
            }
        }
    });
    if piece.len() > tag.len() {
        ok &= put(&chunk_key(key, generation, index), &piece);
    }
    ok && written == len && put(key, tag.as_bytes())
}

/// What a merged document (or each of its pieces) starts with in shared data: `<generation>\n`,
/// so a reader can tell that it belongs to the table it decoded without hashing megabytes.
pub fn tag(generation: u64) -> String {
    format!("{generation}\n")
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
    let mut h = Fnv::default();
    h.write(body);
    h.etag()
}

/// 128-bit FNV-1a, fed in parts.
struct Fnv(u128);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0x6c62272e07bb014262b821756295c58d)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        const PRIME: u128 = 0x0000000001000000000000000000013B;
        for b in bytes {
            self.0 ^= u128::from(*b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    fn etag(&self) -> String {
        format!("\"{:032X}\"", self.0)
    }
}
