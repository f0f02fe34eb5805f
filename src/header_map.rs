//! The proxy-wasm ABI's serialized header map, as `proxy_get_header_map_pairs` returns it, read in
//! place: a `u32` count, then each pair's key and value sizes (`u32`, `u32`), then each key and
//! value followed by a NUL, all little-endian (proxy-wasm-cpp-host `src/pairs_util.cc`).
//!
//! The filter reads every request header name once per request when it asserts client-certificate
//! identities (clients' copies of the identity headers are removed by prefix, so no list of names to
//! ask for exists). The SDK's reader allocates a `String` and a `Vec` per header: about 50 000 wasm
//! instructions for client-go's headers (`bench/req_probe.py`). Reading names straight from the
//! host's buffer allocates nothing.

/// The pairs of a serialized map, in order. A map cut short or with sizes past its end yields the
/// pairs before the damage and stops (a host bug, not input a client controls).
pub fn pairs(buf: &[u8]) -> Pairs<'_> {
    let count = u32_at(buf, 0).unwrap_or(0) as usize;
    // Sizes start after the count; data after the sizes.
    let data = count
        .checked_mul(8)
        .and_then(|n| n.checked_add(4))
        .unwrap_or(usize::MAX);
    Pairs {
        buf,
        left: count,
        size_at: 4,
        data_at: data,
    }
}

/// Iterator over (name, value) byte slices of a serialized map.
pub struct Pairs<'a> {
    buf: &'a [u8],
    left: usize,
    size_at: usize,
    data_at: usize,
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let item = self.read();
        if item.is_none() {
            self.left = 0;
        }
        item
    }
}

impl<'a> Pairs<'a> {
    fn read(&mut self) -> Option<(&'a [u8], &'a [u8])> {
        let key_len = u32_at(self.buf, self.size_at)? as usize;
        let value_len = u32_at(self.buf, self.size_at.checked_add(4)?)? as usize;
        let key_end = self.data_at.checked_add(key_len)?;
        let key = self.buf.get(self.data_at..key_end)?;
        let value_at = key_end.checked_add(1)?;
        let value_end = value_at.checked_add(value_len)?;
        let value = self.buf.get(value_at..value_end)?;
        self.size_at = self.size_at.checked_add(8)?;
        self.data_at = value_end.checked_add(1)?;
        self.left -= 1;
        Some((key, value))
    }
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// The serialized form of `pairs` (what the host sends; tests and the fuzz target).
pub fn serialize(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}
