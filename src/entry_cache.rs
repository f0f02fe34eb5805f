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

use crate::snapshot::Key;

/// Keys and their members' bit sets, for one table head (one key-set version): an open-addressing
/// table of [`EntryCache::SLOTS`] slots found by the FNV-1a hash of the key's text, which a
/// [`Key`] computes from its parts, so a hit neither formats the key nor allocates.
#[derive(Debug, Default)]
pub struct EntryCache {
    inner: RefCell<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: Vec<Option<Slot>>,
    len: usize,
    /// A buffer for the text of a key that is not remembered.
    scratch: String,
}

#[derive(Debug)]
struct Slot {
    hash: u64,
    text: Box<str>,
    bits: u64,
}

/// What a lookup can be asked with: a key's text, or its parts.
pub trait LookupKey {
    /// FNV-1a 64 of the key's text.
    fn fnv(&self) -> u64;
    /// Whether `text` is this key's text.
    fn is(&self, text: &str) -> bool;
    /// The key's text into `buf` (cleared first).
    fn write(&self, buf: &mut String);
}

impl LookupKey for str {
    fn fnv(&self) -> u64 {
        fnv(FNV_OFFSET, self.as_bytes())
    }

    fn is(&self, text: &str) -> bool {
        self == text
    }

    fn write(&self, buf: &mut String) {
        buf.clear();
        buf.push_str(self);
    }
}

impl LookupKey for Key<'_> {
    fn fnv(&self) -> u64 {
        let mut h = fnv(FNV_OFFSET, self.kind().as_bytes());
        for p in self.parts() {
            h = fnv((h ^ u64::from(b'/')).wrapping_mul(FNV_PRIME), p.as_bytes());
        }
        h
    }

    fn is(&self, text: &str) -> bool {
        // Byte slices, not `strip_prefix` with a char: this runs on every request.
        let text = text.as_bytes();
        let kind = self.kind().as_bytes();
        if text.get(..kind.len()) != Some(kind) {
            return false;
        }
        let mut at = kind.len();
        for p in self.parts() {
            let p = p.as_bytes();
            if text.get(at) != Some(&b'/') || text.get(at + 1..at + 1 + p.len()) != Some(p) {
                return false;
            }
            at += 1 + p.len();
        }
        at == text.len()
    }

    fn write(&self, buf: &mut String) {
        Key::write(self, buf)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while let Some(b) = bytes.get(i) {
        h = (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

impl EntryCache {
    /// Slots of the table (a power of two).
    pub const SLOTS: usize = 512;
    /// Distinct keys remembered before the cache is emptied (half the slots: short probes; a key
    /// and its bits take about 80 bytes: 32 KiB per worker at most).
    pub const CAPACITY: usize = Self::SLOTS / 2;

    /// The bit set of `key`: remembered, or `read(text)` remembered when it is an answer (`Some`).
    /// `None` from `read` (a bucket of another key set, or damaged) is not remembered: the next
    /// request reads again.
    pub fn get_or_read<K: LookupKey + ?Sized>(&self, key: &K, read: impl FnOnce(&str) -> Option<u64>) -> u64 {
        let hash = key.fnv();
        let mut inner = self.inner.borrow_mut();
        if inner.slots.is_empty() {
            inner.slots.resize_with(Self::SLOTS, || None);
        }
        let mask = Self::SLOTS - 1;
        let mut at = (hash as usize) & mask;
        // Probe until the key or an empty slot (there always is one: at most half are full).
        loop {
            match inner.slots.get(at) {
                Some(Some(slot)) if slot.hash == hash && key.is(&slot.text) => return slot.bits,
                Some(Some(_)) => at = (at + 1) & mask,
                _ => break,
            }
        }
        let Inner { scratch, .. } = &mut *inner;
        key.write(scratch);
        let Some(bits) = read(scratch) else { return 0 };
        if inner.len >= Self::CAPACITY {
            inner.slots.iter_mut().for_each(|s| *s = None);
            inner.len = 0;
            at = (hash as usize) & mask;
        }
        let text: Box<str> = inner.scratch.as_str().into();
        if let Some(slot) = inner.slots.get_mut(at) {
            *slot = Some(Slot { hash, text, bits });
            inner.len += 1;
        }
        bits
    }

    /// How many keys are remembered (tests).
    pub fn len(&self) -> usize {
        self.inner.borrow().len
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
