//! Peer-aggregated discovery merge (upstream `peer_aggregated_handler.go`, docs/design.md) and `MergePreservingRelativeOrder`.
#![cfg(test)]

mod common;

use common::{
    fixture, fixture_json, group, json_gvrs, json_subresources, res, stale, strings, sub, ver, AGG_133, AGG_137,
};
use kube_peer_proxy::discovery::documents::{parse_aggregated, to_v2_json, GroupDiscovery, Gvk, Strs};
use kube_peer_proxy::discovery::merge::{merge_groups, merge_preserving_relative_order};

#[test]
fn merge_preserving_relative_order_examples() {
    struct Row {
        name: &'static str,
        lists: Vec<Vec<&'static str>>,
        want: Vec<&'static str>,
    }
    let rows = [
        Row {
            name: "spec: A=[g1,g2] B=[g2,g1]",
            lists: vec![vec!["g1", "g2"], vec!["g2", "g1"]],
            want: vec!["g1", "g2"],
        },
        Row {
            name: "spec: B first wins",
            lists: vec![vec!["g2", "g1"], vec!["g1", "g2"]],
            want: vec!["g2", "g1"],
        },
        Row {
            name: "spec: A=[g1] B=[g2]",
            lists: vec![vec!["g1"], vec!["g2"]],
            want: vec!["g1", "g2"],
        },
        Row {
            name: "spec: A=[g2] B=[g1] (lexicographic)",
            lists: vec![vec!["g2"], vec!["g1"]],
            want: vec!["g1", "g2"],
        },
        Row {
            name: "cycle falls back to lexicographic",
            lists: vec![vec!["c", "a"], vec!["a", "c"], vec!["b"]],
            want: vec!["a", "b", "c"],
        },
        Row {
            name: "three-way cycle",
            lists: vec![vec!["z", "y"], vec!["y", "x"], vec!["x", "z"]],
            want: vec!["x", "y", "z"],
        },
        Row {
            name: "topological order beats lexicographic",
            lists: vec![vec!["z", "y"], vec!["y", "x"]],
            want: vec!["z", "y", "x"],
        },
        Row {
            name: "superset list wins even if not first",
            lists: vec![vec!["b"], vec!["c", "b", "a"]],
            want: vec!["c", "b", "a"],
        },
        Row {
            name: "insertion between known neighbours",
            lists: vec![vec!["a", "c"], vec!["a", "b", "d"]],
            want: vec!["a", "b", "c", "d"],
        },
        Row {
            name: "a list with duplicates is not a candidate",
            lists: vec![vec!["b", "a", "b"], vec!["a"]],
            want: vec!["a", "b"],
        },
        Row {
            name: "empty",
            lists: vec![],
            want: vec![],
        },
        Row {
            name: "empty lists",
            lists: vec![vec![], vec![]],
            want: vec![],
        },
        Row {
            name: "single list",
            lists: vec![vec!["q", "p"]],
            want: vec!["q", "p"],
        },
    ];
    for row in rows {
        assert_eq!(merge_preserving_relative_order(&row.lists), row.want, "{}", row.name);
    }
}

fn names(groups: &[GroupDiscovery]) -> Vec<&str> {
    groups.iter().map(|g| g.metadata.name.as_str()).collect()
}

fn find<'a>(groups: &'a [GroupDiscovery], name: &str) -> &'a GroupDiscovery {
    groups
        .iter()
        .find(|g| g.metadata.name == name)
        .unwrap_or_else(|| panic!("group {name}"))
}

#[test]
fn group_order_follows_merge_preserving_relative_order() {
    let a = vec![
        group("g1", vec![ver("v1", vec![])]),
        group("g2", vec![ver("v1", vec![])]),
    ];
    let b = vec![
        group("g2", vec![ver("v1", vec![])]),
        group("g1", vec![ver("v1", vec![])]),
    ];
    assert_eq!(names(&merge_groups(&[&a, &b])), ["g1", "g2"]);
    assert_eq!(names(&merge_groups(&[&b, &a])), ["g2", "g1"]);

    let c = vec![group("g1", vec![ver("v1", vec![])])];
    let d = vec![group("g2", vec![ver("v1", vec![])])];
    assert_eq!(names(&merge_groups(&[&c, &d])), ["g1", "g2"]);
    assert_eq!(names(&merge_groups(&[&d, &c])), ["g1", "g2"]);

    // Single server: returned unchanged.
    assert_eq!(merge_groups(&[&a]), a);
    assert!(merge_groups(&[]).is_empty());
}

#[test]
fn versions_union_and_order() {
    // Peer adds a new version: [v1] + [v2] -> [v1, v2] (no preferred-version recomputation).
    let local = vec![group("g", vec![ver("v1", vec![res("things", &[])])])];
    let peer = vec![group("g", vec![ver("v2", vec![res("things", &[])])])];
    let merged = merge_groups(&[&local, &peer]);
    let versions: Vec<&str> = find(&merged, "g").versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["v1", "v2"]);

    // [v1] + [v2, v1] -> [v2, v1] (the superset list wins).
    let peer = vec![group("g", vec![ver("v2", vec![]), ver("v1", vec![res("things", &[])])])];
    let merged = merge_groups(&[&local, &peer]);
    let versions: Vec<&str> = find(&merged, "g").versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["v2", "v1"]);
}

#[test]
fn resource_capabilities() {
    let mut a_res = res("widgets", &["status"]);
    a_res.verbs = Strs::from(strings(&["watch", "get", "list"]));
    a_res.singular_resource = "widget".into();
    a_res.short_names = Strs::from(strings(&["wd"]));
    a_res.categories = Vec::new().into();
    a_res.scope = "".into();
    a_res.response_kind = None;
    if let Some(s) = a_res.subresources.first_mut() {
        s.verbs = Strs::from(strings(&["get"]));
    }
    let mut b_res = res("widgets", &["scale", "resize", "status"]);
    b_res.verbs = Strs::from(strings(&["create", "get", "delete"]));
    b_res.singular_resource = "other".into();
    b_res.short_names = Strs::from(strings(&["zz"]));
    b_res.categories = Strs::from(strings(&["all"]));
    b_res.scope = "Cluster".into();
    b_res.response_kind = Some(Gvk {
        group: "".into(),
        version: "".into(),
        kind: "Widget".into(),
    });

    let a = vec![group("x.io", vec![ver("v1", vec![a_res])])];
    let b = vec![group("x.io", vec![ver("v1", vec![b_res])])];
    let merged = merge_groups(&[&a, &b]);
    let r = find(&merged, "x.io")
        .versions
        .first()
        .and_then(|v| v.resources.first())
        .expect("widgets");
    assert_eq!(
        r.verbs,
        Strs::from(strings(&["create", "delete", "get", "list", "watch"])),
        "verbs: sorted union"
    );
    let subs: Vec<&str> = r.subresources.iter().map(|s| s.subresource.as_str()).collect();
    assert_eq!(subs, ["resize", "scale", "status"], "subresources: sorted union");
    let status = r
        .subresources
        .iter()
        .find(|s| s.subresource == "status")
        .expect("status");
    assert_eq!(
        status.verbs,
        Strs::from(strings(&["get"])),
        "the first server wins on a subresource clash (deliberate)"
    );
    assert_eq!(r.singular_resource, "widget", "first server's metadata wins");
    assert_eq!(
        r.short_names,
        Strs::from(strings(&["wd"])),
        "first server's metadata wins"
    );
    assert_eq!(
        r.categories,
        Strs::from(strings(&["all"])),
        "empty fields are filled from the second server"
    );
    assert_eq!(r.scope, "Cluster", "empty fields are filled from the second server");
    assert_eq!(r.response_kind.as_ref().map(|k| k.kind.as_str()), Some("Widget"));
}

#[test]
fn identical_resources_are_kept_as_is() {
    let mut r = res("widgets", &["status"]);
    r.verbs = Strs::from(strings(&["watch", "get"])); // unsorted on purpose: identical resources are not touched
    let a = vec![group("x.io", vec![ver("v1", vec![r.clone()])])];
    let b = vec![group("x.io", vec![ver("v1", vec![r.clone()])])];
    let merged = merge_groups(&[&a, &b]);
    assert_eq!(merged, a);
}

#[test]
fn resources_union_and_order() {
    let a = vec![group("x.io", vec![ver("v1", vec![res("a", &[]), res("c", &[])])])];
    let b = vec![group(
        "x.io",
        vec![ver("v1", vec![res("a", &[]), res("b", &[]), res("d", &[])])],
    )];
    let merged = merge_groups(&[&a, &b]);
    let v = find(&merged, "x.io").versions.first().expect("v1");
    let got: Vec<&str> = v.resources.iter().map(|r| r.resource.as_str()).collect();
    assert_eq!(got, ["a", "b", "c", "d"]);
}

#[test]
fn first_server_group_metadata_and_freshness() {
    // Stale on the first server, Current on the second: the merged version is Current with the second's resources.
    let a = vec![group("metrics.k8s.io", vec![stale("v1beta1")])];
    let b = vec![group("metrics.k8s.io", vec![ver("v1beta1", vec![res("pods", &[])])])];
    let merged = merge_groups(&[&a, &b]);
    let v = find(&merged, "metrics.k8s.io").versions.first().expect("v1beta1");
    assert_eq!(v.freshness, "Current");
    assert!(!v.is_stale());
    assert_eq!(
        v.resources.iter().map(|r| r.resource.as_str()).collect::<Vec<_>>(),
        ["pods"]
    );

    // Current first, Stale second: stays Current.
    let merged = merge_groups(&[&b, &a]);
    let v = find(&merged, "metrics.k8s.io").versions.first().expect("v1beta1");
    assert_eq!(v.freshness, "Current");
    assert_eq!(v.resources.len(), 1);

    // Both stale: stale.
    let merged = merge_groups(&[&a, &a]);
    assert!(find(&merged, "metrics.k8s.io").versions.first().expect("v").is_stale());
}

#[test]
fn core_group_merges_by_empty_name() {
    let local = vec![group("", vec![ver("v1", vec![res("pods", &["status", "exec"])])])];
    let peer = vec![group(
        "",
        vec![ver(
            "v1",
            vec![res("pods", &["resize", "status"]), res("configmaps", &[])],
        )],
    )];
    let merged = merge_groups(&[&local, &peer]);
    assert_eq!(merged.len(), 1);
    let v = merged.first().and_then(|g| g.versions.first()).expect("core v1");
    let pods = v.resources.iter().find(|r| r.resource == "pods").expect("pods");
    let subs: Vec<&str> = pods.subresources.iter().map(|s| s.subresource.as_str()).collect();
    assert_eq!(subs, ["exec", "resize", "status"]);
    assert!(v.resources.iter().any(|r| r.resource == "configmaps"));
    let json: serde_json::Value = serde_json::from_slice(&to_v2_json(&merged)).expect("json");
    assert_eq!(json["items"][0]["metadata"], serde_json::json!({}));
}

#[test]
fn subresource_verbs_do_not_merge() {
    let mut a_res = res("widgets", &[]);
    a_res.subresources = vec![sub("status", &["get"])];
    let mut b_res = res("widgets", &[]);
    b_res.subresources = vec![sub("status", &["patch"])];
    b_res.verbs = Strs::from(strings(&["create"]));
    let a = vec![group("x.io", vec![ver("v1", vec![a_res])])];
    let b = vec![group("x.io", vec![ver("v1", vec![b_res])])];
    let merged = merge_groups(&[&a, &b]);
    let r = merged
        .first()
        .and_then(|g| g.versions.first())
        .and_then(|v| v.resources.first())
        .expect("widgets");
    assert_eq!(
        r.subresources.first().map(|s| s.verbs.clone()),
        Some(Strs::from(strings(&["get"])))
    );
}

#[test]
fn real_mixed_version_pair_is_the_union() {
    let old = parse_aggregated(&fixture(AGG_133)).expect("1.33").items;
    let new = parse_aggregated(&fixture(AGG_137)).expect("1.37").items;
    let (old_json, new_json) = (fixture_json(AGG_133), fixture_json(AGG_137));

    let mut want_gvrs = json_gvrs(&old_json);
    want_gvrs.extend(json_gvrs(&new_json));
    let mut want_subs = json_subresources(&old_json);
    want_subs.extend(json_subresources(&new_json));
    // 71 + 84 with 59 in common (12 only in 1.33, 25 only in 1.37-dev).
    assert_eq!(want_gvrs.len(), 96);
    assert!(want_subs.contains(&("storage.k8s.io".into(), "v1".into(), "csinodes".into(), "status".into())));

    for (label, order) in [("old first", [&old, &new]), ("new first", [&new, &old])] {
        let merged = merge_groups(&[order[0].as_slice(), order[1].as_slice()]);
        let doc: serde_json::Value = serde_json::from_slice(&to_v2_json(&merged)).expect("json");
        assert_eq!(json_gvrs(&doc), want_gvrs, "{label}: GVRs");
        assert_eq!(json_subresources(&doc), want_subs, "{label}: (GVR, subresource) pairs");
        assert_eq!(merged.len(), 24, "{label}: groups");
        // No duplicate groups, versions, resources or subresources.
        for g in &merged {
            let mut vs: Vec<&str> = g.versions.iter().map(|v| v.version.as_str()).collect();
            vs.sort_unstable();
            vs.dedup();
            assert_eq!(vs.len(), g.versions.len(), "{label}: {}", g.metadata.name);
            for v in &g.versions {
                let mut rs: Vec<&str> = v.resources.iter().map(|r| r.resource.as_str()).collect();
                rs.sort_unstable();
                rs.dedup();
                assert_eq!(
                    rs.len(),
                    v.resources.len(),
                    "{label}: {}/{}",
                    g.metadata.name,
                    v.version
                );
            }
        }
        // 1.37-dev lists every group of 1.33 plus two new ones at the end: its order wins.
        assert_eq!(names(&merged), names(&new), "{label}");
        // resource.k8s.io: 1.37's [v1, v1beta2, v1beta1, v1alpha3] contains 1.33's versions.
        let versions: Vec<&str> = find(&merged, "resource.k8s.io")
            .versions
            .iter()
            .map(|v| v.version.as_str())
            .collect();
        assert_eq!(versions, ["v1", "v1beta2", "v1beta1", "v1alpha3"], "{label}");
    }

    // Verbs and subresources on a shared resource are unions.
    let merged = merge_groups(&[old.as_slice(), new.as_slice()]);
    let storage_v1 = find(&merged, "storage.k8s.io")
        .versions
        .iter()
        .find(|v| v.version == "v1")
        .expect("storage v1");
    let csinodes = storage_v1
        .resources
        .iter()
        .find(|r| r.resource == "csinodes")
        .expect("csinodes");
    assert!(csinodes.subresources.iter().any(|s| s.subresource == "status"));
    // Versions of storage.k8s.io: 1.33 has [v1, v1beta1, v1alpha1], 1.37-dev only [v1].
    let versions: Vec<&str> = find(&merged, "storage.k8s.io")
        .versions
        .iter()
        .map(|v| v.version.as_str())
        .collect();
    assert_eq!(versions, ["v1", "v1beta1", "v1alpha1"]);
}

#[test]
fn merge_is_deterministic() {
    let old = parse_aggregated(&fixture(AGG_133)).expect("1.33").items;
    let new = parse_aggregated(&fixture(AGG_137)).expect("1.37").items;
    let first = to_v2_json(&merge_groups(&[old.as_slice(), new.as_slice()]));
    for _ in 0..5 {
        let again = to_v2_json(&merge_groups(&[old.as_slice(), new.as_slice()]));
        assert_eq!(first, again);
    }
    let three = to_v2_json(&merge_groups(&[old.as_slice(), new.as_slice(), old.as_slice()]));
    assert_eq!(
        three,
        to_v2_json(&merge_groups(&[old.as_slice(), new.as_slice(), old.as_slice()]))
    );
}

/// The discovery service serializes the borrowed merge (it copies only resources two servers
/// describe differently); it must write the same bytes as the owned merge, in every order.
#[test]
fn borrowed_merge_writes_the_same_bytes_as_the_owned_merge() {
    use kube_peer_proxy::discovery::documents::{legacy_group_list_json, to_legacy_group_list_json, LegacyGroup};
    use kube_peer_proxy::discovery::merge::merge_group_views;
    use std::borrow::Cow;
    let old = parse_aggregated(&fixture(AGG_133)).expect("1.33").items;
    let new = parse_aggregated(&fixture(AGG_137)).expect("1.37").items;
    for servers in [
        vec![old.as_slice(), new.as_slice()],
        vec![new.as_slice(), old.as_slice()],
        vec![old.as_slice(), new.as_slice(), old.as_slice()],
        vec![new.as_slice()],
        vec![],
    ] {
        let owned = merge_groups(&servers);
        let views = merge_group_views(&servers);
        assert_eq!(to_v2_json(&views), to_v2_json(&owned));
        assert_eq!(
            legacy_group_list_json(views.iter().map(LegacyGroup::from).collect()),
            to_legacy_group_list_json(&owned)
        );
        if servers.len() == 2 {
            // Both versions share most resources unchanged: those stay borrowed.
            let copied = views
                .iter()
                .flat_map(|g| &g.versions)
                .flat_map(|v| &v.resources)
                .filter(|r| matches!(r, Cow::Owned(_)))
                .count();
            let all: usize = views.iter().flat_map(|g| &g.versions).map(|v| v.resources.len()).sum();
            assert!(copied * 4 < all, "{copied} of {all} resources copied");
        }
    }
}
