//! The serving table: keys, bit sets, encoding, ETags.
#![cfg(test)]

mod common;

use common::{fixture, group, res, stale, ver, AGG_133, AGG_137};
use kube_peer_proxy::discovery::documents::parse_aggregated;
use std::cell::RefCell;
use std::collections::HashMap;

use kube_peer_proxy::snapshot::{
    bucket_count, bucket_key, bucket_lookup, bucket_of, chunk_key, etag, group_key, put_document, resource_key,
    subresource_key, tag, unknown_key, untag, version_key, Key, KeySource, ServerDiscovery, ServerRef, Table, CHUNK,
    MAX_SERVERS, WHOLE_LIMIT,
};

fn server(name: &str, local: bool) -> ServerRef {
    ServerRef {
        name: name.into(),
        cluster: format!("cluster-{name}"),
        local,
        address: None,
    }
}

fn sample() -> (ServerDiscovery, ServerDiscovery) {
    let local = ServerDiscovery {
        core: vec![group(
            "",
            vec![ver(
                "v1",
                vec![res("pods", &["status", "exec"]), res("configmaps", &[])],
            )],
        )],
        groups: vec![
            group("apps", vec![ver("v1", vec![res("deployments", &["scale", "status"])])]),
            group("metrics.k8s.io", vec![stale("v1beta1")]),
        ],
    };
    let peer = ServerDiscovery {
        core: vec![group(
            "",
            vec![ver("v1", vec![res("pods", &["status", "exec", "resize"])])],
        )],
        groups: vec![
            group("apps", vec![ver("v1", vec![res("deployments", &["scale", "status"])])]),
            group(
                "resource.k8s.io",
                vec![ver("v1", vec![res("resourceclaims", &["status"])])],
            ),
            group("stale.io", vec![stale_with_resources("v1", "widgets")]),
        ],
    };
    (local, peer)
}

/// A Stale version that still lists resources (a peer's stale GV must not attract traffic).
fn stale_with_resources(version: &str, resource: &str) -> kube_peer_proxy::discovery::documents::VersionDiscovery {
    let mut v = stale(version);
    v.resources = vec![res(resource, &["status"])];
    v
}

#[test]
fn keys_are_distinct_by_shape() {
    assert_eq!(resource_key("", "v1", "pods"), "r//v1/pods");
    assert_eq!(subresource_key("", "v1", "pods", "resize"), "s//v1/pods/resize");
    assert_eq!(version_key("apps", "v1"), "v/apps/v1");
    assert_eq!(group_key("apps"), "g/apps");
    assert_eq!(group_key(""), "g/");
}

#[test]
fn build_and_lookup() {
    let (local, peer) = sample();
    let table = Table::build(&[(server("local", true), &local), (server("peer-b", false), &peer)]);
    assert_eq!(table.generation, 0);
    assert_eq!(table.servers.len(), 2);
    assert_eq!(table.local_mask(), 0b01);

    struct K {
        key: String,
        want: u64,
    }
    let rows = [
        K {
            key: resource_key("", "v1", "pods"),
            want: 0b11,
        },
        K {
            key: resource_key("", "v1", "configmaps"),
            want: 0b01,
        },
        K {
            key: subresource_key("", "v1", "pods", "status"),
            want: 0b11,
        },
        K {
            key: subresource_key("", "v1", "pods", "resize"),
            want: 0b10,
        },
        K {
            key: subresource_key("", "v1", "pods", "nope"),
            want: 0,
        },
        K {
            key: version_key("", "v1"),
            want: 0b11,
        },
        K {
            key: group_key(""),
            want: 0b11,
        },
        K {
            key: resource_key("apps", "v1", "deployments"),
            want: 0b11,
        },
        K {
            key: subresource_key("apps", "v1", "deployments", "scale"),
            want: 0b11,
        },
        K {
            key: resource_key("resource.k8s.io", "v1", "resourceclaims"),
            want: 0b10,
        },
        K {
            key: version_key("resource.k8s.io", "v1"),
            want: 0b10,
        },
        K {
            key: group_key("resource.k8s.io"),
            want: 0b10,
        },
        // Stale versions are not served by anybody.
        K {
            key: version_key("metrics.k8s.io", "v1beta1"),
            want: 0,
        },
        K {
            key: group_key("metrics.k8s.io"),
            want: 0,
        },
        K {
            key: resource_key("stale.io", "v1", "widgets"),
            want: 0,
        },
        K {
            key: subresource_key("stale.io", "v1", "widgets", "status"),
            want: 0,
        },
        K {
            key: group_key("stale.io"),
            want: 0,
        },
        K {
            key: resource_key("apps", "v1", "nope"),
            want: 0,
        },
        K {
            key: "garbage".into(),
            want: 0,
        },
    ];
    for row in rows {
        assert_eq!(table.servers_for(&row.key), row.want, "{}", row.key);
    }
}

#[test]
fn local_mask_follows_the_local_flag() {
    let (local, peer) = sample();
    let t = Table::build(&[(server("peer-b", false), &peer), (server("local", true), &local)]);
    assert_eq!(t.local_mask(), 0b10);
    let t = Table::build(&[(server("peer-b", false), &peer)]);
    assert_eq!(t.local_mask(), 0, "local server without fresh data");
    assert_eq!(Table::default().local_mask(), 0);
    assert_eq!(Table::default().servers_for(&resource_key("", "v1", "pods")), 0);
}

#[test]
fn encode_decode_roundtrip() {
    let (local, peer) = sample();
    let mut table = Table::build(&[(server("local", true), &local), (server("peer-b", false), &peer)]);
    table.generation = 7;
    table.built_ms = 1_700_000_000_000;
    table.apis_etag = etag(b"apis");
    table.api_etag = etag(b"api");
    let bytes = table.encode();
    let decoded = Table::decode(&bytes).expect("decode");
    assert_eq!(decoded, table);
    // Deterministic encoding: building again gives the same bytes.
    let mut again = Table::build(&[(server("local", true), &local), (server("peer-b", false), &peer)]);
    again.generation = 7;
    again.built_ms = 1_700_000_000_000;
    again.apis_etag = etag(b"apis");
    again.api_etag = etag(b"api");
    assert_eq!(again.encode(), bytes);
    assert_eq!(decoded.encode(), bytes);

    assert!(Table::decode(b"").is_err());
    assert!(Table::decode(b"{").is_err());
    assert!(Table::decode(b"{}").is_err());
    assert!(Table::decode(br#"{"generation":"x"}"#).is_err());
}

#[test]
fn fixtures_build_a_table() {
    let old = ServerDiscovery {
        core: Vec::new(),
        groups: parse_aggregated(&fixture(AGG_133)).expect("1.33").items,
    };
    let new = ServerDiscovery {
        core: Vec::new(),
        groups: parse_aggregated(&fixture(AGG_137)).expect("1.37").items,
    };
    let table = Table::build(&[(server("old", true), &old), (server("new", false), &new)]);
    let count = |mask: u64| {
        table
            .keys
            .iter()
            .filter(|(k, v)| k.starts_with("r/") && **v == mask)
            .count()
    };
    assert_eq!(count(0b01), 12, "GVRs only in 1.33");
    assert_eq!(count(0b10), 25, "GVRs only in 1.37-dev");
    assert_eq!(count(0b11), 59, "GVRs in both");
    assert_eq!(
        table.servers_for(&resource_key("networking.k8s.io", "v1beta1", "ipaddresses")),
        0b01
    );
    assert_eq!(
        table.servers_for(&resource_key("resource.k8s.io", "v1", "resourceclaims")),
        0b10
    );
    assert_eq!(
        table.servers_for(&subresource_key("storage.k8s.io", "v1", "csinodes", "status")),
        0b10
    );
    assert_eq!(
        table.servers_for(&resource_key("storage.k8s.io", "v1", "csinodes")),
        0b11
    );
    assert_eq!(table.servers_for(&group_key("lifecycle.k8s.io")), 0b10);
    let roundtrip = Table::decode(&table.encode()).expect("decode");
    assert_eq!(roundtrip, table);
}

#[test]
fn at_most_max_servers() {
    let d = ServerDiscovery {
        core: Vec::new(),
        groups: vec![group("x.io", vec![ver("v1", vec![res("things", &[])])])],
    };
    let servers: Vec<(ServerRef, &ServerDiscovery)> = (0..MAX_SERVERS + 3)
        .map(|i| (server(&format!("s{i:02}"), i == 0), &d))
        .collect();
    let table = Table::build(&servers);
    assert_eq!(table.servers.len(), MAX_SERVERS);
    assert_eq!(table.servers_for(&resource_key("x.io", "v1", "things")), u64::MAX);
}

#[test]
fn etag_is_stable_and_content_sensitive() {
    let a = etag(b"{\"items\":[]}");
    assert_eq!(a, etag(b"{\"items\":[]}"));
    assert_ne!(a, etag(b"{\"items\":[1]}"));
    assert_ne!(etag(b""), etag(b" "));
    assert_ne!(etag(b"ab"), etag(b"ba"));
    for t in [&a, &etag(b""), &etag(&fixture(AGG_133))] {
        assert_eq!(t.len(), 34, "{t}");
        assert!(t.starts_with('"') && t.ends_with('"'), "{t}");
        let hex = t.trim_matches('"');
        assert!(
            hex.chars().all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)),
            "{t}"
        );
    }
    // FNV-1a offset basis for the empty input.
    assert_eq!(etag(b""), "\"6C62272E07BB014262B821756295C58D\"");
    assert_ne!(etag(&fixture(AGG_133)), etag(&fixture(AGG_137)));
}

#[test]
fn unhealthy_mask_roundtrips_and_defaults_to_zero() {
    let (local, peer) = sample();
    let mut table = Table::build(&[(server("local", true), &local), (server("peer-b", false), &peer)]);
    assert_eq!(table.unhealthy, 0);
    table.unhealthy = 0b10;
    let decoded = Table::decode(&table.encode()).expect("decode");
    assert_eq!(decoded.unhealthy, 0b10);
    assert_eq!(decoded, table);
    // An encoding without the field (older writer) decodes with nobody unhealthy.
    let mut v: serde_json::Value = serde_json::from_slice(&table.encode()).expect("json");
    v.as_object_mut().expect("object").remove("unhealthy");
    let old = Table::decode(&serde_json::to_vec(&v).expect("bytes")).expect("decode old");
    assert_eq!(old.unhealthy, 0);
    assert_eq!(old.keys, table.keys);
}

#[test]
fn tagged_documents_are_only_accepted_for_their_generation() {
    let tag = |generation: u64, doc: &[u8]| [tag(generation).as_bytes(), doc].concat();
    let doc = br#"{"kind":"APIGroupDiscoveryList","items":[]}"#;
    let stored = tag(42, doc);
    assert_eq!(untag(42, stored.clone()).as_deref(), Some(&doc[..]));
    // A document of another generation (the service is mid-write) is not used.
    assert_eq!(untag(41, stored.clone()), None);
    assert_eq!(untag(42, doc.to_vec()), None, "untagged bytes");
    assert_eq!(untag(42, b"x42\n{}".to_vec()), None);
    assert_eq!(untag(42, Vec::new()), None);
    assert_eq!(untag(7, tag(7, b"")).as_deref(), Some(&b""[..]));
}

#[test]
fn a_large_document_is_cut_into_pieces_that_cover_it_exactly() {
    use kube_peer_proxy::snapshot::{chunk_count, is_chunked, WHOLE_LIMIT};
    assert!(!is_chunked(WHOLE_LIMIT as u64) && is_chunked(WHOLE_LIMIT as u64 + 1) && !is_chunked(0));
    let tagged = tag(7).len();
    for len in [WHOLE_LIMIT + 1, 5 * CHUNK, 5 * CHUNK + 1, 10 * CHUNK - 7] {
        let doc: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let (ok, puts) = put(&doc, len as u64, 7);
        assert!(ok, "{len}");
        // The pieces, then the tag alone under the document's key.
        assert_eq!(puts.len(), chunk_count(len as u64) + 1, "{len}");
        let mut joined = Vec::new();
        for (i, (key, piece)) in puts.iter().take(puts.len() - 1).enumerate() {
            assert_eq!(key, &chunk_key("k", 7, i));
            assert!(piece.len() <= CHUNK + tagged && piece.len() > tagged);
            joined.extend_from_slice(&untag(7, piece.clone()).expect("tagged"));
        }
        assert_eq!(joined, doc, "{len}");
    }
    // Two slots by generation parity: the next generation does not overwrite this one's pieces,
    // the one after does.
    assert_ne!(chunk_key("k", 7, 0), chunk_key("k", 8, 0));
    assert_eq!(chunk_key("k", 7, 0), chunk_key("k", 9, 0));
}

thread_local! {
    /// Stands in for Envoy's shared data in the entry tests.
    static SHARED: RefCell<HashMap<String, Vec<u8>>> = RefCell::new(HashMap::new());
}

fn read_shared(key: &str) -> Option<Vec<u8>> {
    SHARED.with(|m| m.borrow().get(key).cloned())
}

/// What the discovery service does: entries (for a new key set), then the head.
fn publish(table: &Table, keys_changed: bool) -> Vec<u8> {
    if keys_changed {
        SHARED.with(|m| m.borrow_mut().extend(table.entries().map(|(k, v)| (k, v.to_vec()))));
    }
    table.encode_head()
}

/// What a filter VM does: decode the head, look entries up in shared data.
fn worker_view(head: &[u8]) -> Table {
    Table {
        key_source: KeySource::Shared(read_shared),
        ..Table::decode(head).expect("head")
    }
}

#[test]
fn a_head_reads_its_entries_from_shared_data() {
    let old = ServerDiscovery {
        core: Vec::new(),
        groups: parse_aggregated(&fixture(AGG_133)).expect("1.33").items,
    };
    let new = ServerDiscovery {
        core: Vec::new(),
        groups: parse_aggregated(&fixture(AGG_137)).expect("1.37").items,
    };
    let mut table = Table::build(&[(server("old", true), &old), (server("new", false), &new)]);
    table.generation = 3;
    table.keys_slot = 1;
    table.keys_version = 1_000;
    // As a member whose group list names a version without its resources leaves it.
    table.keys.insert(unknown_key("wardle.example.com", "v1alpha1"), 2);
    table.keys.insert(unknown_key("wardle.example.com", ""), 2);
    let head = publish(&table, true);
    assert!(head.len() * 4 < table.encode().len(), "the head leaves the keys out");
    let view = worker_view(&head);
    // Only the unknown keys stay in the head (no host call for the question every request asks).
    assert!(view.keys.keys().all(|k| k.starts_with("u/")), "{:?}", view.keys);
    assert_eq!(view.keys.len(), 2);
    let written: Vec<(String, Vec<u8>)> = table.entries().collect();
    assert!(
        written.iter().all(|(_, v)| !v.windows(2).any(|w| w == b"u/")),
        "the unknown keys are in the head, not in buckets"
    );
    // Buckets, not one entry per key: about KEYS_PER_BUCKET keys each, empty ones not written.
    let keys = table.keys.len();
    assert_eq!(table.keys_buckets, bucket_count(keys - 2));
    assert!(written.len() * 4 < keys, "{} buckets for {keys} keys", written.len());
    assert!(written.len() <= table.keys_buckets as usize);
    for (key, bits) in table.keys.iter().filter(|(k, _)| k.starts_with("u/")) {
        assert_eq!(view.servers_for(key), *bits, "{key}: from the head, not shared data");
    }
    for (key, bits) in &table.keys {
        assert_eq!(view.servers_for(key), *bits, "{key}");
    }
    // By parts, as routing asks: the same answers, from what the view remembers or shared data.
    for (key, bits) in table.keys.iter().filter(|(k, _)| !k.starts_with("u/")) {
        let parts: Vec<&str> = key.split('/').collect();
        let k = match parts[..] {
            ["g", g] => Key::group(g),
            ["v", g, v] => Key::version(g, v),
            ["r", g, v, r] => Key::resource(g, v, r),
            ["s", g, v, r, sub] => Key::subresource(g, v, r, sub),
            _ => continue,
        };
        assert_eq!(view.servers_for_key(&k), *bits, "{key}");
        assert_eq!(table.servers_for_key(&k), *bits, "{key}");
    }
    for key in [
        resource_key("nope.io", "v1", "x"),
        unknown_key("apps", "v1"),
        group_key(""),
    ] {
        assert_eq!(view.servers_for(&key), table.servers_for(&key), "{key}");
    }
    // Everything else of the table survives the head.
    assert_eq!(view.servers, table.servers);
    assert_eq!(
        (view.fresh_core, view.fresh_groups, view.known_groups),
        (table.fresh_core, table.fresh_groups, table.known_groups)
    );
    assert_eq!((view.keys_slot, view.keys_version), (1, 1_000));
}

#[test]
fn entries_of_another_key_set_are_not_taken() {
    let d = |resources: &[&str]| ServerDiscovery {
        core: Vec::new(),
        groups: vec![group(
            "x.io",
            vec![ver("v1", resources.iter().map(|r| res(r, &[])).collect())],
        )],
    };
    let (a, b, c) = (d(&["alpha", "beta"]), d(&["beta"]), d(&["gamma"]));
    let set = |disc: &ServerDiscovery, slot: u8, version: u64| {
        let mut t = Table::build(&[(server("local", true), disc)]);
        t.keys_slot = slot;
        t.keys_version = version;
        t
    };
    let alpha = resource_key("x.io", "v1", "alpha");
    let beta = resource_key("x.io", "v1", "beta");
    let gamma = resource_key("x.io", "v1", "gamma");
    // Key set 1 in slot 1, set 2 in slot 0: a worker still on set 1 reads it intact meanwhile.
    let head1 = publish(&set(&a, 1, 10), true);
    let head2 = publish(&set(&b, 0, 11), true);
    let (v1, v2) = (worker_view(&head1), worker_view(&head2));
    assert_eq!((v1.servers_for(&alpha), v1.servers_for(&beta)), (1, 1));
    assert_eq!((v2.servers_for(&alpha), v2.servers_for(&beta)), (0, 1));
    // Set 3 reuses slot 1, where set 1's `alpha` and `beta` entries stay: they carry version 10.
    let head3 = publish(&set(&c, 1, 12), true);
    let v3 = worker_view(&head3);
    assert_eq!(
        (v3.servers_for(&alpha), v3.servers_for(&beta), v3.servers_for(&gamma)),
        (0, 0, 1)
    );
}

/// A bucket as `Table::entries` writes it: version, then (length, key, bits) per key.
fn bucket(version: u64, keys: &[(&str, u64)]) -> Vec<u8> {
    let mut v = version.to_le_bytes().to_vec();
    for (k, bits) in keys {
        v.extend_from_slice(&(k.len() as u32).to_le_bytes());
        v.extend_from_slice(k.as_bytes());
        v.extend_from_slice(&bits.to_le_bytes());
    }
    v
}

#[test]
fn a_bucket_answers_for_its_own_key_set_and_damage_is_no_entry() {
    let b = bucket(12, &[("r/x.io/v1/a", 5), ("r/x.io/v1/ab", 6), ("", 7)]);
    assert_eq!(bucket_lookup(12, &b, "r/x.io/v1/a"), Some(5));
    assert_eq!(bucket_lookup(12, &b, "r/x.io/v1/ab"), Some(6));
    assert_eq!(bucket_lookup(12, &b, ""), Some(7));
    assert_eq!(bucket_lookup(12, &b, "r/x.io/v1/abc"), Some(0), "not in the set");
    assert_eq!(bucket_lookup(11, &b, "r/x.io/v1/a"), None, "another key set's bucket");
    assert_eq!(bucket_lookup(12, &bucket(12, &[]), "r/x.io/v1/a"), Some(0));
    // A cut inside a record, or a length past the end, is no entry (and never a panic); a cut
    // between records reads as a bucket without the later keys (shared data values are written
    // whole, so that is the host's own guarantee).
    let (first, second) = (8 + 4 + 11 + 8, 8 + 4 + 11 + 8 + 4 + 12 + 8);
    for cut in 0..b.len() {
        let want = match cut {
            8 => Some(0),
            c if c == first => Some(0),
            c if c >= second => Some(6),
            _ => None,
        };
        assert_eq!(bucket_lookup(12, &b[..cut], "r/x.io/v1/ab"), want, "{cut}");
    }
    let mut huge = 12u64.to_le_bytes().to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(b"r/x");
    assert_eq!(bucket_lookup(12, &huge, "r/x"), None);
    // The bucket of a key: stable, within range, and spread.
    assert_eq!(bucket_count(0), 1);
    assert_eq!(bucket_count(41_406), 1024);
    assert!(bucket_of("r/x.io/v1/a", 4096) < 4096);
    assert_eq!(bucket_of("r/x.io/v1/a", 4096), bucket_of("r/x.io/v1/a", 4096));
    assert_eq!(bucket_of("anything", 1), 0);
    let used: std::collections::BTreeSet<u32> = (0..4096).map(|i| bucket_of(&format!("r/g{i}.io/v1/r"), 512)).collect();
    assert!(used.len() > 480, "{} of 512 buckets used", used.len());
    assert_ne!(bucket_key(0, 3), bucket_key(1, 3));
}

#[test]
fn the_fingerprint_is_the_etag_of_the_whole_encoding_without_writing_it() {
    let old = ServerDiscovery {
        core: Vec::new(),
        groups: parse_aggregated(&fixture(AGG_133)).expect("1.33").items,
    };
    let mut table = Table::build(&[(server("old", true), &old)]);
    assert_eq!(table.fingerprint(), etag(&table.encode()));
    table.generation = 7;
    assert_eq!(table.fingerprint(), etag(&table.encode()));
    table.keys.insert(resource_key("x.io", "v1", "widgets"), 1);
    assert_eq!(table.fingerprint(), etag(&table.encode()));
}

/// What `put_document` puts, in order.
fn put(doc: &[u8], len: u64, generation: u64) -> (bool, Vec<(String, Vec<u8>)>) {
    let mut puts = Vec::new();
    let ok = put_document(
        "k",
        generation,
        len,
        // Written in odd-sized writes, as a serializer does.
        &mut |sink| doc.chunks(1000).for_each(&mut *sink),
        &mut |k, v| {
            puts.push((k.to_string(), v.to_vec()));
            true
        },
    );
    (ok, puts)
}

#[test]
fn a_document_is_put_as_it_is_written_in_the_pieces_a_worker_reads() {
    // Small: whole, tagged, under its own key.
    let small = b"{\"kind\":\"APIGroupDiscoveryList\"}".to_vec();
    let (ok, puts) = put(&small, small.len() as u64, 7);
    assert!(ok);
    assert_eq!(puts, vec![("k".to_string(), [&b"7\n"[..], &small].concat())]);

    // Large: CHUNK-sized pieces, each tagged, then the tag alone under the key.
    let large: Vec<u8> = (0..(WHOLE_LIMIT + 3 * CHUNK + 17)).map(|i| (i % 251) as u8).collect();
    let (ok, puts) = put(&large, large.len() as u64, 8);
    assert!(ok);
    let mut want: Vec<(String, Vec<u8>)> = large
        .chunks(CHUNK)
        .enumerate()
        .map(|(i, piece)| (chunk_key("k", 8, i), [&b"8\n"[..], piece].concat()))
        .collect();
    want.push(("k".to_string(), b"8\n".to_vec()));
    assert_eq!(puts.len(), want.len());
    assert_eq!(puts, want);

    // A document that is not as long as measured is not published as if it were.
    assert!(!put(&large, large.len() as u64 + 1, 8).0);
    assert!(!put(&small, small.len() as u64 - 1, 8).0);
    // A failed put fails the document.
    let failed = put_document("k", 1, large.len() as u64, &mut |sink| sink(&large), &mut |_, _| false);
    assert!(!failed);
}
