//! Key buckets are read from shared data by every rerouted or local request: a damaged or foreign
//! bucket must be no entry, never a panic, and what `Table::entries` writes must read back.
#![no_main]
use kube_peer_proxy::snapshot::{bucket_count, bucket_key, bucket_lookup, bucket_of, Table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Any bytes as a bucket, asked for any key.
    let (key, value) = data.split_at(data.len().min(usize::from(data.first().copied().unwrap_or(0) % 32)));
    let key = String::from_utf8_lossy(key);
    let _ = bucket_lookup(7, value, &key);
    let _ = bucket_lookup(u64::from_le_bytes([0; 8]), value, &key);
    // Keys made from the input, published and read back from the buckets alone.
    let mut table = Table::default();
    for (i, k) in String::from_utf8_lossy(data).split('\n').take(200).enumerate() {
        if !k.starts_with("u/") {
            table.keys.insert(k.to_string(), i as u64 + 1);
        }
    }
    table.keys_version = 9;
    table.keys_slot = 1;
    table.keys_buckets = bucket_count(table.keys.len());
    let written: std::collections::HashMap<String, Vec<u8>> = table.entries().collect();
    for (k, bits) in &table.keys {
        let b = written.get(&bucket_key(1, bucket_of(k, table.keys_buckets))).expect("its bucket");
        assert_eq!(bucket_lookup(9, b, k), Some(*bits), "{k:?}");
        assert_eq!(bucket_lookup(8, b, k), None);
    }
});
