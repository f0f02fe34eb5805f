//! FNV-1a 64 as a `Hasher`, for the per-VM maps the request path looks up ([`crate::entry_cache`],
//! [`crate::metrics::LabelledIds`]): their keys are short, and the std hasher's per-map random seed
//! (SipHash) costs a WASI random call per map and more instructions per key. Keys can come from
//! request paths, so a client can choose them, but each map is bounded: colliding keys cost at most
//! its size in comparisons.

use std::hash::Hasher;

#[derive(Default)]
pub struct Fnv64(u64);

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}
