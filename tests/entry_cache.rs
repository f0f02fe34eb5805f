//! A worker's remembered table entries: a key asked by its text or by its parts is the same key, a
//! hit reads nothing, a miss reads once, an unreadable entry is not remembered, and the cache stays
//! within its capacity and right past it.
#![cfg(test)]

use std::cell::RefCell;

use kube_peer_proxy::entry_cache::{EntryCache, LookupKey};
use kube_peer_proxy::snapshot::Key;

fn keys() -> Vec<(Key<'static>, String)> {
    let mut out = Vec::new();
    for (g, v) in [
        ("", "v1"),
        ("apps", "v1"),
        ("resource.k8s.io", "v1beta2"),
        ("a", "b"),
        ("", ""),
    ] {
        out.push((Key::group(g), format!("g/{g}")));
        out.push((Key::version(g, v), format!("v/{g}/{v}")));
        for r in ["pods", "deployments", "r", ""] {
            out.push((Key::resource(g, v, r), format!("r/{g}/{v}/{r}")));
            out.push((Key::subresource(g, v, r, "status"), format!("s/{g}/{v}/{r}/status")));
        }
    }
    out
}

#[test]
fn parts_and_text_name_the_same_key() {
    let all = keys();
    for (key, text) in &all {
        let mut written = String::from("junk");
        key.write(&mut written);
        assert_eq!(&written, text);
        assert_eq!(key.fnv(), text.as_str().fnv(), "{text}");
        for (_, other) in &all {
            assert_eq!(key.is(other), other == text, "{text} vs {other}");
        }
        // Near misses: one more part, the last byte cut, another kind.
        assert!(!key.is(&format!("{text}/x")), "{text}");
        assert!(!key.is(&text[..text.len() - 1]), "{text}");
        assert!(!key.is(&format!("x{}", &text[1..])), "{text}");
    }
}

#[test]
fn a_hit_reads_nothing_and_a_miss_reads_once() {
    let cache = EntryCache::default();
    let reads = RefCell::new(Vec::<String>::new());
    let read = |text: &str| {
        reads.borrow_mut().push(text.to_string());
        Some(text.len() as u64)
    };
    for round in 0..3 {
        for (key, text) in keys() {
            assert_eq!(cache.get_or_read(&key, read), text.len() as u64, "{round} {text}");
            assert_eq!(
                cache.get_or_read(text.as_str(), read),
                text.len() as u64,
                "{round} {text}"
            );
        }
    }
    let mut want: Vec<String> = Vec::new();
    for (_, t) in keys() {
        if !want.contains(&t) {
            want.push(t);
        }
    }
    assert_eq!(*reads.borrow(), want, "each key read once, by its text");
    assert_eq!(cache.len(), want.len());
    // Not remembered: an entry that could not be read (another key set's bucket).
    let fresh = EntryCache::default();
    assert_eq!(fresh.get_or_read("r/x/v1/y", |_| None), 0);
    assert_eq!(fresh.get_or_read("r/x/v1/y", |_| Some(5)), 5);
    assert_eq!(fresh.get_or_read("r/x/v1/y", |_| Some(9)), 5);
}

#[test]
fn the_cache_is_bounded_and_right_past_its_capacity() {
    let cache = EntryCache::default();
    let mut reads = 0;
    for round in 0..2 {
        for i in 0..EntryCache::CAPACITY * 3 {
            let text = format!("r/g{i}/v1/things");
            let got = cache.get_or_read(text.as_str(), |t| {
                reads += 1;
                Some(t.len() as u64 * 7 + i as u64)
            });
            assert_eq!(got, text.len() as u64 * 7 + i as u64, "{round} {text}");
            assert!(cache.len() <= EntryCache::CAPACITY);
        }
    }
    assert_eq!(
        reads,
        2 * EntryCache::CAPACITY * 3,
        "cycling through more keys than fit reads them again"
    );
}
