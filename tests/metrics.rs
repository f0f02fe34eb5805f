//! The metric-name encoding and the allocation-free lookups the filter's id cache relies on.

use kube_peer_proxy::metrics::{is_name, name, name_hash};

#[test]
fn is_name_and_name_hash_agree_with_name() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("m", &[]),
        (
            "kube_peer_proxy_rerouted_request_total",
            &[
                ("code", "200"),
                ("group", "apps"),
                ("version", "v1"),
                ("resource", "deployments"),
            ],
        ),
        ("m", &[("group", ""), ("version", "v1")]),
        ("m", &[("resource", "a;b=c\nd")]),
        ("m", &[("server", "ünïcode")]),
    ];
    for (base, labels) in cases {
        let full = name(base, labels);
        assert!(is_name(&full, base, labels), "{full}");
        let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
        for b in full.bytes() {
            fnv ^= u64::from(b);
            fnv = fnv.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(name_hash(base, labels), fnv, "{full}");
    }
}

#[test]
fn is_name_rejects_every_other_label_set() {
    let full = name("m", &[("code", "200"), ("group", "apps")]);
    for (base, labels) in [
        ("m", &[("code", "200")][..]),
        ("m", &[("code", "200"), ("group", "app")][..]),
        ("m", &[("code", "200"), ("group", "appss")][..]),
        ("m", &[("code", "201"), ("group", "apps")][..]),
        ("m", &[("group", "apps"), ("code", "200")][..]),
        ("n", &[("code", "200"), ("group", "apps")][..]),
        ("m", &[("code", "200"), ("group", "apps"), ("x", "")][..]),
    ] {
        assert!(!is_name(&full, base, labels), "{base} {labels:?}");
    }
    // Sanitised characters compare as their replacement only when the label held one.
    assert!(!is_name(&name("m", &[("a", "_")]), "m", &[("a", "x")]));
    assert!(is_name(&name("m", &[("a", ";")]), "m", &[("a", "=")]));
}
