//! The metric-name encoding and the per-VM cache of labelled counter ids the filter relies on.

use kube_peer_proxy::metrics::{name, LabelledIds};

#[test]
fn names_encode_labels_and_sanitise_values() {
    assert_eq!(
        name(
            "kube_peer_proxy_rerouted_request_total",
            &[
                ("code", "200"),
                ("group", "apps"),
                ("version", "v1"),
                ("resource", "deployments")
            ]
        ),
        "kube_peer_proxy_rerouted_request_total;code=200;group=apps;version=v1;resource=deployments"
    );
    assert_eq!(name("m", &[]), "m");
    assert_eq!(name("m", &[("resource", "a;b=c\nd")]), "m;resource=a_b_c_d");
    assert_eq!(name("m", &[("server", "ünïcode")]), "m;server=ünïcode");
}

/// A label set seen before is found without defining (or formatting) anything; every other label
/// set, base, order or count is defined once, with the name `name` gives it.
#[test]
fn labelled_ids_define_each_label_set_once() {
    let mut ids = LabelledIds::default();
    let mut defined: Vec<String> = Vec::new();
    let sets: &[(&str, &[(&str, &str)])] = &[
        ("m", &[("code", "200"), ("group", "apps")]),
        ("m", &[("code", "200"), ("group", "app")]),
        ("m", &[("code", "200"), ("group", "appss")]),
        ("m", &[("code", "201"), ("group", "apps")]),
        ("m", &[("group", "apps"), ("code", "200")]),
        ("n", &[("code", "200"), ("group", "apps")]),
        ("m", &[("code", "200"), ("group", "apps"), ("x", "")]),
        ("m", &[("code", "200")]),
        ("m", &[("code", "20"), ("group", "0apps")]),
        ("m", &[]),
    ];
    for round in 0..3 {
        for (i, (base, labels)) in sets.iter().enumerate() {
            let id = ids.id(base, labels, |n| {
                defined.push(n.to_string());
                Some(100 + i as u32)
            });
            assert_eq!(id, Some(100 + i as u32), "round {round}: {base} {labels:?}");
        }
        assert_eq!(defined.len(), sets.len(), "round {round}");
    }
    let want: Vec<String> = sets.iter().map(|(b, l)| name(b, l)).collect();
    assert_eq!(defined, want);
    // A definition the host refuses is not remembered.
    let mut refused = LabelledIds::default();
    assert_eq!(refused.id("m", &[("a", "b")], |_| None), None);
    assert_eq!(refused.id("m", &[("a", "b")], |_| Some(7)), Some(7));
}

/// Past its capacity the cache starts over: ids are defined again, never wrong.
#[test]
fn labelled_ids_are_bounded() {
    let mut ids = LabelledIds::default();
    let mut defines = 0;
    for round in 0..2 {
        for i in 0..LabelledIds::CAPACITY + 10 {
            let v = i.to_string();
            let got = ids.id("m", &[("resource", &v)], |_| {
                defines += 1;
                Some(i as u32)
            });
            assert_eq!(got, Some(i as u32), "round {round} {i}");
        }
    }
    assert!(defines > LabelledIds::CAPACITY + 10, "{defines}");
}
