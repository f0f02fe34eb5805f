//! The allocation-free classifier against the one it replaced (`tests/reference/request_info_before.rs`),
//! on every path of up to four segments over a vocabulary of the grammar's words, then on 200 000
//! longer ones with queries, escapes and slashes, under every method: the same answer, field by field.
#![cfg(test)]

#[path = "reference/request_info_before.rs"]
mod before;

use kube_peer_proxy::request::request_info::{self, RequestKind};

const WORDS: &[&str] = &[
    "",
    "api",
    "apis",
    "v1",
    "apps",
    "namespaces",
    "ns",
    "pods",
    "status",
    "finalize",
    "watch",
    "proxy",
    "name",
    "sub",
    "x%2Fy",
    "%",
    "a b",
    "é",
];
const QUERIES: &[&str] = &[
    "",
    "?",
    "?watch=true",
    "?watch=0",
    "?wat%63h=1",
    "?watch=FALSE&watch=1",
    "?fieldSelector=metadata.name%3Dweb",
    "?fieldSelector=metadata.name==a,b=c",
    "?fieldSelector=metadata.name%3Dx%2Fy",
    "?labelSelector=app%3Dweb&limit=500",
    "?field%53elector=metadata.name=n",
    "?watch",
    "?&&watch=1&",
    "?fieldSelector=metadata.name=a+b",
];
const METHODS: &[&str] = &["GET", "get", "HEAD", "POST", "put", "PATCH", "DELETE", "OPTIONS", ""];

/// A field-by-field view both map to (`Cow`'s `Debug` is its text's).
fn view_new(k: &RequestKind) -> String {
    format!("{k:?}")
}

fn view_old(k: &before::RequestKind) -> String {
    match k {
        before::RequestKind::Resource(r) => format!(
            "Resource(ResourceRequest {{ verb: {:?}, group: {:?}, version: {:?}, namespace: {:?}, resource: {:?}, name: {:?}, subresource: {:?} }})",
            r.verb, r.group, r.version, r.namespace, r.resource, r.name, r.subresource
        ),
        other => format!("{other:?}"),
    }
}

fn check(method: &str, path: &str) {
    let (mut a, mut b) = (String::new(), String::new());
    let new = request_info::parse_decoded(method, path, &mut a);
    let old = before::parse_decoded(method, path, &mut b);
    assert_eq!(view_new(&new), view_old(&old), "{method} {path}");
}

#[test]
fn every_short_path_is_classified_as_before() {
    let mut n = 0;
    let mut paths = vec![String::new()];
    for _ in 0..4 {
        let mut next = Vec::new();
        for p in &paths {
            for w in WORDS {
                next.push(format!("{p}/{w}"));
            }
        }
        for p in &next {
            for m in ["GET", "DELETE", "OPTIONS"] {
                check(m, p);
                check(m, &format!("{p}/"));
                n += 2;
            }
        }
        paths = next;
    }
    assert!(n > 600_000, "{n} cases");
}

#[test]
fn longer_paths_with_queries_are_classified_as_before() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for _ in 0..200_000 {
        let mut path = String::new();
        if next(4) == 0 {
            path.push('/');
        }
        for _ in 0..next(12) {
            path.push('/');
            path.push_str(WORDS[next(WORDS.len())]);
        }
        for _ in 0..next(3) {
            path.push('/');
        }
        path.push_str(QUERIES[next(QUERIES.len())]);
        check(METHODS[next(METHODS.len())], &path);
    }
}
