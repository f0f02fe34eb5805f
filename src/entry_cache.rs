//! A worker's few remembered table entries: the members serving each key a worker looked up lately,
//! so a request for a resource type seen before reads no shared data.
//!
//! The discovery service publishes the table's keys in shared-data buckets (see
//! [`crate::snapshot::bucket_key`]) and no worker holds the table: its memory would grow with the
//! table and with Envoy's worker count. Reading the bucket on every request cost a host call, a copy
//! of a few hundred bytes into the VM and a scan: about 3 400 wasm instructions of the local GET's
//! 37 000 (`bench/req_probe.py`). Requests repeat a handful of resource types (pods, leases,
//! configmaps, events, …), so a worker remembers up to [`EntryCache::CAPACITY`] answers for the head
//! it routes with; a new head (a new snapshot) starts with none. Memory per worker is bounded by the
//! capacity, not by the table. When full, the cache is emptied rather than managing an order: a
//! worker that sees more distinct keys than that reads shared data as before, nothing worse.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::fnv::Fnv64;

/// Keys and their members' bit sets, for one table head (one key-set version).
#[derive(Debug, Default)]
pub struct EntryCache {
    map: RefCell<HashMap<Box<str>, u64, BuildHasherDefault<Fnv64>>>,
    /// A buffer for the key being looked up (see [`crate::snapshot::Table::servers_for_key`]).
    scratch: RefCell<String>,
}

impl EntryCache {
    /// Distinct keys remembered before the cache is emptied (a key and its bits take about 80
    /// bytes with the map's own: 20 KiB per worker at most).
    pub const CAPACITY: usize = 256;

    /// The bit set of `key`: remembered, or `read(key)` remembered when it is an answer (`Some`).
    /// `None` from `read` (a bucket of another key set, or damaged) is not remembered: the next
    /// request reads again.
    pub fn get_or_read(&self, key: &str, read: impl FnOnce(&str) -> Option<u64>) -> u64 {
        if let Some(bits) = self.map.borrow().get(key) {
            return *bits;
        }
        let Some(bits) = read(key) else { return 0 };
        let mut map = self.map.borrow_mut();
        if map.len() >= Self::CAPACITY {
            map.clear();
        }
        map.insert(key.into(), bits);
        bits
    }

    /// The key buffer, or a new one while it is in use (a lookup within a lookup, which routing
    /// never does).
    pub fn scratch(&self) -> ScratchKey<'_> {
        match self.scratch.try_borrow_mut() {
            Ok(buf) => ScratchKey::Kept(buf),
            Err(_) => ScratchKey::New(String::new()),
        }
    }

    /// How many keys are remembered (tests).
    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PartialEq for EntryCache {
    /// Two tables are equal by content; what a worker remembered of one is not content.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for EntryCache {}

impl Clone for EntryCache {
    /// A copy of a table starts with no remembered entries (its lookups fill its own).
    fn clone(&self) -> Self {
        EntryCache::default()
    }
}

/// A key buffer: the cache's own, or a new one.
pub enum ScratchKey<'a> {
    Kept(std::cell::RefMut<'a, String>),
    New(String),
}

impl std::ops::Deref for ScratchKey<'_> {
    type Target = String;
    fn deref(&self) -> &String {
        match self {
            ScratchKey::Kept(b) => b,
            ScratchKey::New(b) => b,
        }
    }
}

impl std::ops::DerefMut for ScratchKey<'_> {
    fn deref_mut(&mut self) -> &mut String {
        match self {
            ScratchKey::Kept(b) => b,
            ScratchKey::New(b) => b,
        }
    }
}
