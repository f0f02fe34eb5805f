//! Discovery document parsing (aggregated v2/v2beta1 and legacy formats) and re-serialization.
#![cfg(test)]

mod common;

use common::{fixture, fixture_json, json_gvrs, json_subresources, AGG_133, AGG_137};
use kube_peer_proxy::discovery::documents::{
    self, is_aggregated_content_type, parse_aggregated, parse_api_versions, parse_group, parse_group_list,
    parse_resource_list, to_v2_json, version_from_legacy, GroupDiscovery, GroupDiscoveryList, GroupMeta, Gvk,
    ParseError, ResourceDiscovery, SubresourceDiscovery, VersionDiscovery,
};
use std::collections::BTreeSet;

fn model_gvrs(list: &GroupDiscoveryList) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for g in &list.items {
        for v in g.versions.iter().filter(|v| !v.is_stale()) {
            for r in &v.resources {
                out.insert((
                    g.metadata.name.to_string(),
                    v.version.to_string(),
                    r.resource.to_string(),
                ));
            }
        }
    }
    out
}

fn model_subresources(list: &GroupDiscoveryList) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for g in &list.items {
        for v in g.versions.iter().filter(|v| !v.is_stale()) {
            for r in &v.resources {
                for s in &r.subresources {
                    out.insert((
                        g.metadata.name.to_string(),
                        v.version.to_string(),
                        r.resource.to_string(),
                        s.subresource.to_string(),
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn aggregated_fixtures_parse_with_expected_counts() {
    struct F {
        file: &'static str,
        groups: usize,
        gvrs: usize,
        subresources: usize,
    }
    // Counted independently with serde_json::Value below; the group/GVR numbers match PROVENANCE.md.
    let rows = [
        F {
            file: AGG_133,
            groups: 22,
            gvrs: 71,
            subresources: 29,
        },
        F {
            file: AGG_137,
            groups: 24,
            gvrs: 84,
            subresources: 41,
        },
    ];
    for row in rows {
        let list = parse_aggregated(&fixture(row.file)).expect(row.file);
        assert_eq!(list.kind, "APIGroupDiscoveryList", "{}", row.file);
        assert_eq!(list.api_version, "apidiscovery.k8s.io/v2", "{}", row.file);
        assert_eq!(list.items.len(), row.groups, "{}: groups", row.file);
        assert!(
            list.items.iter().flat_map(|g| &g.versions).all(|v| !v.is_stale()),
            "{}",
            row.file
        );

        let json = fixture_json(row.file);
        let want_gvrs = json_gvrs(&json);
        let want_subs = json_subresources(&json);
        assert_eq!(want_gvrs.len(), row.gvrs, "{}: GVRs counted from JSON", row.file);
        assert_eq!(
            want_subs.len(),
            row.subresources,
            "{}: subresources counted from JSON",
            row.file
        );
        assert_eq!(model_gvrs(&list), want_gvrs, "{}", row.file);
        assert_eq!(model_subresources(&list), want_subs, "{}", row.file);
        // No core group in /apis documents.
        assert!(list.items.iter().all(|g| !g.metadata.name.is_empty()), "{}", row.file);
    }
}

#[test]
fn aggregated_fixture_details() {
    let list = parse_aggregated(&fixture(AGG_133)).expect("1.33");
    let apps = list.items.iter().find(|g| g.metadata.name == "apps").expect("apps");
    let v1 = apps.versions.first().expect("apps/v1");
    assert_eq!(v1.version, "v1");
    assert_eq!(v1.freshness, "Current");
    let deployments = v1
        .resources
        .iter()
        .find(|r| r.resource == "deployments")
        .expect("deployments");
    assert_eq!(deployments.scope, "Namespaced");
    assert_eq!(deployments.singular_resource, "deployment");
    assert_eq!(deployments.short_names, vec!["deploy"]);
    assert_eq!(deployments.categories, vec!["all"]);
    assert_eq!(
        deployments.response_kind,
        Some(Gvk {
            group: "".into(),
            version: "".into(),
            kind: "Deployment".into()
        })
    );
    let scale = deployments
        .subresources
        .iter()
        .find(|s| s.subresource == "scale")
        .expect("scale");
    assert_eq!(
        scale.response_kind,
        Some(Gvk {
            group: "autoscaling".into(),
            version: "v1".into(),
            kind: "Scale".into()
        })
    );
    // Version order is preserved (descending preference).
    let autoscaling = list
        .items
        .iter()
        .find(|g| g.metadata.name == "autoscaling")
        .expect("autoscaling");
    let versions: Vec<&str> = autoscaling.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["v2", "v1"]);
    // Group order is preserved.
    assert_eq!(
        list.items.first().map(|g| g.metadata.name.as_str()),
        Some("apiregistration.k8s.io")
    );
}

fn wrap_item(file: &str) -> Vec<u8> {
    let item = fixture_json(file);
    serde_json::to_vec(&serde_json::json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": item["apiVersion"],
        "metadata": {},
        "items": [item],
    }))
    .expect("serialize")
}

#[test]
fn roundtrip_fixtures_v2_and_v2beta1() {
    for file in [
        "roundtrip_apidiscovery.k8s.io.v2.APIGroupDiscovery.json",
        "roundtrip_apidiscovery.k8s.io.v2beta1.APIGroupDiscovery.json",
    ] {
        let list = parse_aggregated(&wrap_item(file)).expect(file);
        assert_eq!(list.items.len(), 1, "{file}");
        let g = list.items.first().expect("item");
        assert_eq!(
            g.metadata.name, "nameValue",
            "{file}: only the name of ObjectMeta is kept"
        );
        let v = g.versions.first().expect("version");
        assert_eq!(v.version, "versionValue", "{file}");
        assert_eq!(v.freshness, "freshnessValue", "{file}");
        assert!(!v.is_stale(), "{file}");
        let gvk = || Gvk {
            group: "groupValue".into(),
            version: "versionValue".into(),
            kind: "kindValue".into(),
        };
        let want = ResourceDiscovery {
            resource: "resourceValue".into(),
            response_kind: Some(gvk()),
            scope: "scopeValue".into(),
            singular_resource: "singularResourceValue".into(),
            verbs: vec!["verbsValue".into()].into(),
            short_names: vec!["shortNamesValue".into()].into(),
            categories: vec!["categoriesValue".into()].into(),
            subresources: vec![SubresourceDiscovery {
                subresource: "subresourceValue".into(),
                response_kind: Some(gvk()),
                accepted_types: vec![gvk()],
                verbs: vec!["verbsValue".into()].into(),
            }],
        };
        assert_eq!(v.resources, vec![want], "{file}");

        // Re-serialized and parsed again: same model, and the full ObjectMeta is reduced to the name.
        let again = parse_aggregated(&to_v2_json(&list.items)).expect("reparse");
        assert_eq!(again.items, list.items, "{file}");
        let out: serde_json::Value = serde_json::from_slice(&to_v2_json(&list.items)).expect("json");
        assert_eq!(
            out["items"][0]["metadata"],
            serde_json::json!({"name": "nameValue"}),
            "{file}"
        );
        assert_eq!(
            out["items"][0]["versions"][0]["resources"][0]["subresources"][0]["acceptedTypes"],
            serde_json::json!([{"group": "groupValue", "version": "versionValue", "kind": "kindValue"}]),
            "{file}"
        );
    }
}

#[test]
fn legacy_api_versions() {
    let v = parse_api_versions(&fixture("legacy_api.json")).expect("APIVersions");
    assert_eq!(v.versions, vec!["v1"]);
}

#[test]
fn legacy_group_list() {
    let list = parse_group_list(&fixture("legacy_apis.k8s-1.31.json")).expect("APIGroupList");
    let json = fixture_json("legacy_apis.k8s-1.31.json");
    let groups = json["groups"].as_array().expect("groups");
    assert_eq!(list.groups.len(), groups.len());
    assert_eq!(list.groups.len(), 22);
    let versions: usize = list.groups.iter().map(|g| g.versions.len()).sum();
    assert_eq!(versions, 32);
    for (parsed, raw) in list.groups.iter().zip(groups) {
        assert_eq!(parsed.name, raw["name"].as_str().expect("name"));
        let raw_versions: Vec<&str> = raw["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .map(|v| v["version"].as_str().expect("v"))
            .collect();
        let parsed_versions: Vec<&str> = parsed.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(parsed_versions, raw_versions, "{}", parsed.name);
    }
    let resource = list
        .groups
        .iter()
        .find(|g| g.name == "resource.k8s.io")
        .expect("resource.k8s.io");
    assert_eq!(
        resource.versions.iter().map(|v| v.version.as_str()).collect::<Vec<_>>(),
        ["v1alpha3"]
    );
}

#[test]
fn legacy_group() {
    let g = parse_group(&fixture("legacy_apis__apps.json")).expect("APIGroup");
    assert_eq!(g.name, "apps");
    assert_eq!(
        g.versions.iter().map(|v| v.version.as_str()).collect::<Vec<_>>(),
        ["v1"]
    );
}

#[test]
fn legacy_apps_v1_resource_list_with_subresources() {
    let list = parse_resource_list(&fixture("legacy_apis__apps__v1.json")).expect("APIResourceList");
    assert_eq!(list.resources.len(), 12);
    let v = version_from_legacy("v1", &list);
    assert_eq!(v.version, "v1");
    assert_eq!(v.freshness, "Current");
    assert!(!v.is_stale());
    let names: Vec<&str> = v.resources.iter().map(|r| r.resource.as_str()).collect();
    assert_eq!(
        names,
        [
            "controllerrevisions",
            "daemonsets",
            "deployments",
            "replicasets",
            "statefulsets"
        ]
    );

    struct S {
        resource: &'static str,
        subs: &'static [&'static str],
    }
    let rows = [
        S {
            resource: "controllerrevisions",
            subs: &[],
        },
        S {
            resource: "daemonsets",
            subs: &["status"],
        },
        S {
            resource: "deployments",
            subs: &["scale", "status"],
        },
        S {
            resource: "replicasets",
            subs: &["scale", "status"],
        },
        S {
            resource: "statefulsets",
            subs: &["scale", "status"],
        },
    ];
    for row in rows {
        let r = v
            .resources
            .iter()
            .find(|r| r.resource == row.resource)
            .expect(row.resource);
        let subs: Vec<&str> = r.subresources.iter().map(|s| s.subresource.as_str()).collect();
        assert_eq!(subs, row.subs, "{}", row.resource);
        assert_eq!(r.scope, "Namespaced", "{}", row.resource);
    }
    let deployments = v
        .resources
        .iter()
        .find(|r| r.resource == "deployments")
        .expect("deployments");
    assert_eq!(deployments.singular_resource, "deployment");
    assert_eq!(deployments.short_names, vec!["deploy"]);
    assert_eq!(deployments.categories, vec!["all"]);
    assert_eq!(deployments.verbs.len(), 8);
    assert_eq!(
        deployments.response_kind.as_ref().map(|k| k.kind.as_str()),
        Some("Deployment")
    );
    let scale = deployments
        .subresources
        .iter()
        .find(|s| s.subresource == "scale")
        .expect("scale");
    assert_eq!(
        scale.response_kind,
        Some(Gvk {
            group: "autoscaling".into(),
            version: "v1".into(),
            kind: "Scale".into()
        })
    );
    assert_eq!(scale.verbs, vec!["get", "patch", "update"]);
}

#[test]
fn legacy_core_v1_without_api_version() {
    let json = fixture_json("legacy_api__v1.k8s-pre-1.33.json");
    assert!(json.get("apiVersion").is_none(), "fixture has no top-level apiVersion");
    let list = parse_resource_list(&fixture("legacy_api__v1.k8s-pre-1.33.json")).expect("core APIResourceList");
    assert_eq!(list.resources.len(), 38);
    let v = version_from_legacy("v1", &list);
    assert_eq!(v.resources.len(), 17);
    let pods = v.resources.iter().find(|r| r.resource == "pods").expect("pods");
    let subs: Vec<&str> = pods.subresources.iter().map(|s| s.subresource.as_str()).collect();
    assert_eq!(
        subs,
        [
            "attach",
            "binding",
            "ephemeralcontainers",
            "eviction",
            "exec",
            "log",
            "portforward",
            "proxy",
            "status"
        ]
    );
    assert!(!subs.contains(&"resize"), "pre-1.33 has no pods/resize");
    let nodes = v.resources.iter().find(|r| r.resource == "nodes").expect("nodes");
    assert_eq!(nodes.scope, "Cluster");
    let ns = v
        .resources
        .iter()
        .find(|r| r.resource == "namespaces")
        .expect("namespaces");
    assert_eq!(
        ns.subresources
            .iter()
            .map(|s| s.subresource.as_str())
            .collect::<Vec<_>>(),
        ["finalize", "status"]
    );
    let total_subs: usize = v.resources.iter().map(|r| r.subresources.len()).sum();
    assert_eq!(total_subs, 21);
}

#[test]
fn version_from_legacy_orphan_subresource() {
    let body = br#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"x.io/v1","resources":[
        {"name":"widgets/status","singularName":"","namespaced":true,"kind":"Widget","verbs":["get"]}]}"#;
    let list = parse_resource_list(body).expect("list");
    let v = version_from_legacy("v1", &list);
    assert_eq!(v.resources.len(), 1);
    let r = v.resources.first().expect("widgets");
    assert_eq!(r.resource, "widgets");
    assert_eq!(
        r.subresources
            .iter()
            .map(|s| s.subresource.as_str())
            .collect::<Vec<_>>(),
        ["status"]
    );
}

#[test]
fn content_type_detection() {
    struct C {
        desc: &'static str,
        content_type: &'static str,
        want: bool,
    }
    let rows = [
        C {
            desc: "v2 canonical",
            content_type: documents::CONTENT_TYPE_V2,
            want: true,
        },
        C {
            desc: "v2beta1",
            content_type: "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
            want: true,
        },
        C {
            desc: "params reordered",
            content_type: "application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io",
            want: true,
        },
        C {
            desc: "spaces",
            content_type: "application/json; g=apidiscovery.k8s.io; v=v2; as=APIGroupDiscoveryList",
            want: true,
        },
        C {
            desc: "extra params tolerated",
            content_type:
                "application/json;charset=utf-8;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer",
            want: true,
        },
        C {
            desc: "upper-case base",
            content_type: "APPLICATION/JSON;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            want: true,
        },
        C {
            desc: "plain JSON",
            content_type: "application/json",
            want: false,
        },
        C {
            desc: "empty",
            content_type: "",
            want: false,
        },
        C {
            desc: "protobuf",
            content_type: "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            want: false,
        },
        C {
            desc: "missing as",
            content_type: "application/json;g=apidiscovery.k8s.io;v=v2",
            want: false,
        },
        C {
            desc: "missing v",
            content_type: "application/json;g=apidiscovery.k8s.io;as=APIGroupDiscoveryList",
            want: false,
        },
        C {
            desc: "missing g",
            content_type: "application/json;v=v2;as=APIGroupDiscoveryList",
            want: false,
        },
        C {
            desc: "unknown version",
            content_type: "application/json;g=apidiscovery.k8s.io;v=v1;as=APIGroupDiscoveryList",
            want: false,
        },
        C {
            desc: "wrong as",
            content_type: "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscovery",
            want: false,
        },
        C {
            desc: "text/plain",
            content_type: "text/plain; charset=utf-8",
            want: false,
        },
    ];
    for row in rows {
        assert_eq!(is_aggregated_content_type(row.content_type), row.want, "{}", row.desc);
    }
}

#[test]
fn malformed_and_wrong_kind_are_errors() {
    struct E {
        desc: &'static str,
        body: &'static [u8],
    }
    let aggregated = [
        E {
            desc: "not JSON",
            body: b"<html>oops</html>",
        },
        E {
            desc: "truncated",
            body: br#"{"kind":"APIGroupDiscoveryList","items":["#,
        },
        E {
            desc: "empty body",
            body: b"",
        },
        E {
            desc: "array",
            body: b"[]",
        },
        E {
            desc: "no kind",
            body: b"{}",
        },
        E {
            desc: "legacy group list",
            body: br#"{"kind":"APIGroupList","groups":[]}"#,
        },
        E {
            desc: "single item",
            body: br#"{"kind":"APIGroupDiscovery","versions":[]}"#,
        },
        E {
            desc: "items of wrong type",
            body: br#"{"kind":"APIGroupDiscoveryList","items":{}}"#,
        },
        E {
            desc: "Status",
            body: br#"{"kind":"Status","apiVersion":"v1","code":500}"#,
        },
    ];
    for row in aggregated {
        assert!(parse_aggregated(row.body).is_err(), "aggregated: {}", row.desc);
    }
    assert!(matches!(parse_aggregated(b"nope"), Err(ParseError::Json(_))));
    assert_eq!(
        parse_aggregated(br#"{"kind":"APIGroupList"}"#),
        Err(ParseError::WrongKind("APIGroupList".into()))
    );

    let apps_v1 = fixture("legacy_apis__apps__v1.json");
    let api = fixture("legacy_api.json");
    let apis = fixture("legacy_apis.k8s-1.31.json");
    let agg = fixture(AGG_133);
    assert!(matches!(parse_api_versions(&apis), Err(ParseError::WrongKind(k)) if k == "APIGroupList"));
    assert!(matches!(parse_api_versions(&agg), Err(ParseError::WrongKind(k)) if k == "APIGroupDiscoveryList"));
    assert!(matches!(parse_group_list(&api), Err(ParseError::WrongKind(k)) if k == "APIVersions"));
    assert!(matches!(parse_group_list(&agg), Err(ParseError::WrongKind(_))));
    assert!(matches!(parse_group(&apis), Err(ParseError::WrongKind(_))));
    assert!(matches!(parse_resource_list(&api), Err(ParseError::WrongKind(_))));
    assert!(matches!(parse_resource_list(&agg), Err(ParseError::WrongKind(_))));
    assert!(parse_group(&apps_v1).is_err());
    for bad in [&b"{"[..], b"", b"null", b"[]", b"42", b"\"APIVersions\""] {
        assert!(parse_api_versions(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        assert!(parse_group_list(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        assert!(parse_group(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        assert!(parse_resource_list(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    // Right kind, wrong field types.
    assert!(parse_api_versions(br#"{"kind":"APIVersions","versions":"v1"}"#).is_err());
    assert!(parse_resource_list(br#"{"kind":"APIResourceList","resources":[{"verbs":[]}]}"#).is_err());
    // Error messages are readable.
    assert!(ParseError::WrongKind("X".into()).to_string().contains("\"X\""));
    assert!(ParseError::Json("eof".into()).to_string().contains("invalid JSON"));
}

#[test]
fn to_v2_json_field_order_and_omitempty() {
    let core = GroupDiscovery {
        metadata: GroupMeta::default(),
        versions: vec![VersionDiscovery {
            version: "v1".into(),
            resources: vec![ResourceDiscovery {
                resource: "pods".into(),
                response_kind: Some(Gvk {
                    group: "".into(),
                    version: "".into(),
                    kind: "Pod".into(),
                }),
                scope: "Namespaced".into(),
                singular_resource: "pod".into(),
                verbs: vec!["get".into(), "list".into()].into(),
                short_names: vec!["po".into()].into(),
                categories: vec!["all".into()].into(),
                subresources: vec![SubresourceDiscovery {
                    subresource: "eviction".into(),
                    response_kind: Some(Gvk {
                        group: "policy".into(),
                        version: "v1".into(),
                        kind: "Eviction".into(),
                    }),
                    accepted_types: vec![Gvk {
                        group: "policy".into(),
                        version: "v1".into(),
                        kind: "Eviction".into(),
                    }],
                    verbs: vec!["create".into()].into(),
                }],
            }],
            freshness: "Current".into(),
        }]
        .into(),
    };
    let got = String::from_utf8(to_v2_json(&[core])).expect("utf8");
    let want = concat!(
        r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":["#,
        r#"{"metadata":{},"versions":[{"version":"v1","resources":[{"resource":"pods","#,
        r#""responseKind":{"group":"","version":"","kind":"Pod"},"scope":"Namespaced","singularResource":"pod","#,
        r#""verbs":["get","list"],"shortNames":["po"],"categories":["all"],"subresources":[{"subresource":"eviction","#,
        r#""responseKind":{"group":"policy","version":"v1","kind":"Eviction"},"#,
        r#""acceptedTypes":[{"group":"policy","version":"v1","kind":"Eviction"}],"verbs":["create"]}]}],"#,
        r#""freshness":"Current"}]}]}"#
    );
    assert_eq!(got, want);

    // Empty optional fields are omitted; verbs, scope and singularResource are always present.
    let sparse = vec![
        GroupDiscovery {
            metadata: GroupMeta { name: "x.io".into() },
            versions: vec![
                VersionDiscovery {
                    version: "v1".into(),
                    resources: vec![ResourceDiscovery {
                        resource: "things".into(),
                        subresources: vec![SubresourceDiscovery {
                            subresource: "status".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    freshness: "".into(),
                },
                VersionDiscovery {
                    version: "v0".into(),
                    resources: Vec::new(),
                    freshness: "Stale".into(),
                },
            ]
            .into(),
        },
        GroupDiscovery {
            metadata: GroupMeta {
                name: "empty.io".into(),
            },
            versions: Vec::new().into(),
        },
    ];
    let got = String::from_utf8(to_v2_json(&sparse)).expect("utf8");
    let want = concat!(
        r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":["#,
        r#"{"metadata":{"name":"x.io"},"versions":[{"version":"v1","resources":[{"resource":"things","scope":"","#,
        r#""singularResource":"","verbs":[],"subresources":[{"subresource":"status","verbs":[]}]}]},"#,
        r#"{"version":"v0","freshness":"Stale"}]},"#,
        r#"{"metadata":{"name":"empty.io"},"versions":[]}]}"#
    );
    assert_eq!(got, want);

    // An empty list still has every list field.
    assert_eq!(
        String::from_utf8(to_v2_json::<GroupDiscovery>(&[])).expect("utf8"),
        r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}"#
    );
}

#[test]
fn to_v2_json_of_a_fixture_reparses_identically() {
    for file in [AGG_133, AGG_137] {
        let list = parse_aggregated(&fixture(file)).expect(file);
        let out = to_v2_json(&list.items);
        let again = parse_aggregated(&out).expect("reparse");
        assert_eq!(again.items, list.items, "{file}");
        assert_eq!(again.api_version, "apidiscovery.k8s.io/v2");
        // Same content as the original document, modulo key order.
        let a: serde_json::Value = serde_json::from_slice(&out).expect("json");
        let b = fixture_json(file);
        assert_eq!(json_gvrs(&a), json_gvrs(&b), "{file}");
        assert_eq!(json_subresources(&a), json_subresources(&b), "{file}");
        let text = String::from_utf8(out).expect("utf8");
        let kind = text.find(r#""kind""#).expect("kind");
        let api_version = text.find(r#""apiVersion""#).expect("apiVersion");
        let metadata = text.find(r#""metadata""#).expect("metadata");
        let items = text.find(r#""items""#).expect("items");
        assert!(
            kind < api_version && api_version < metadata && metadata < items,
            "{file}"
        );
    }
}

#[test]
fn list_metadata_content_is_ignored() {
    let body = br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2",
        "metadata":{"resourceVersion":"5","continue":"x"},
        "items":[{"metadata":{"name":"a.io","creationTimestamp":null},"versions":[{"version":"v1","freshness":"Stale"}]}]}"#;
    let list = parse_aggregated(body).expect("parse");
    let g = list.items.first().expect("item");
    assert_eq!(g.metadata.name, "a.io");
    assert!(g.versions.first().expect("v1").is_stale());
}

#[test]
fn missing_kind_is_tolerated_only_with_the_fields_of_the_type() {
    type Check = fn(&[u8]) -> bool;
    struct K {
        desc: &'static str,
        check: Check,
        body: &'static [u8],
        ok: bool,
    }
    let versions: Check = |b| parse_api_versions(b).is_ok();
    let group_list: Check = |b| parse_group_list(b).is_ok();
    let group: Check = |b| parse_group(b).is_ok();
    let resources: Check = |b| parse_resource_list(b).is_ok();
    let rows = [
        K {
            desc: "APIVersions without kind",
            check: versions,
            body: br#"{"versions":["v1"]}"#,
            ok: true,
        },
        K {
            desc: "APIGroupList without kind",
            check: group_list,
            body: br#"{"groups":[]}"#,
            ok: true,
        },
        K {
            desc: "APIGroup without kind",
            check: group,
            body: br#"{"name":"apps","versions":[]}"#,
            ok: true,
        },
        K {
            desc: "APIResourceList without kind",
            check: resources,
            body: br#"{"groupVersion":"v1","resources":[]}"#,
            ok: true,
        },
        K {
            desc: "empty object as APIVersions",
            check: versions,
            body: b"{}",
            ok: false,
        },
        K {
            desc: "empty object as APIGroupList",
            check: group_list,
            body: b"{}",
            ok: false,
        },
        K {
            desc: "empty object as APIGroup",
            check: group,
            body: b"{}",
            ok: false,
        },
        K {
            desc: "empty object as APIResourceList",
            check: resources,
            body: b"{}",
            ok: false,
        },
        K {
            desc: "error object as APIResourceList",
            check: resources,
            body: br#"{"message":"oops"}"#,
            ok: false,
        },
        K {
            desc: "error object as APIGroupList",
            check: group_list,
            body: br#"{"error":"x"}"#,
            ok: false,
        },
        K {
            desc: "non-string kind",
            check: resources,
            body: br#"{"kind":5}"#,
            ok: false,
        },
    ];
    for row in rows {
        assert_eq!((row.check)(row.body), row.ok, "{}", row.desc);
    }
}

#[test]
fn legacy_group_list_from_aggregated_is_what_client_go_would_split_out() {
    use kube_peer_proxy::discovery::documents::{to_legacy_group_list_json, GroupDiscovery, GroupMeta};
    let mut items = parse_aggregated(&fixture(AGG_133)).expect("1.33").items;
    // A group whose only version is Stale has nothing to list; the core group never appears in /apis.
    items.push(GroupDiscovery {
        metadata: GroupMeta {
            name: "metrics.k8s.io".into(),
        },
        versions: vec![common::stale("v1beta1")].into(),
    });
    items.push(GroupDiscovery {
        metadata: GroupMeta::default(),
        versions: vec![common::ver("v1", vec![])].into(),
    });
    let doc: serde_json::Value = serde_json::from_slice(&to_legacy_group_list_json(&items)).expect("json");
    assert_eq!(
        (doc["kind"].as_str(), doc["apiVersion"].as_str()),
        (Some("APIGroupList"), Some("v1"))
    );
    let groups = doc["groups"].as_array().expect("groups");
    let expected = fixture_json(AGG_133);
    assert_eq!(groups.len(), expected["items"].as_array().expect("items").len());
    let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
    assert!(!names.contains(&"metrics.k8s.io") && !names.contains(&""));
    let resource = groups
        .iter()
        .find(|g| g["name"] == "resource.k8s.io")
        .expect("resource.k8s.io");
    let versions: Vec<&str> = resource["versions"]
        .as_array()
        .expect("v")
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert_eq!(versions, ["v1beta2", "v1beta1", "v1alpha3"]);
    assert_eq!(resource["preferredVersion"]["groupVersion"], "resource.k8s.io/v1beta2");
    assert_eq!(resource["versions"][1]["groupVersion"], "resource.k8s.io/v1beta1");
    // The same shape as the real legacy fixture.
    let real = fixture_json("legacy_apis.k8s-1.31.json");
    let keys = |g: &serde_json::Value| g.as_object().map(|o| o.keys().cloned().collect::<BTreeSet<_>>());
    assert_eq!(keys(&groups[0]), keys(&real["groups"][0]));
}

/// The address of a string's bytes: equal addresses are one shared block.
fn at(s: &str) -> *const u8 {
    s.as_ptr()
}

#[test]
fn a_parsed_document_shares_its_repeated_strings_and_serializes_unchanged() {
    let body = fixture(AGG_137);
    let list = parse_aggregated(&body).expect("1.37");
    let resources: Vec<&ResourceDiscovery> = list
        .items
        .iter()
        .flat_map(|g| g.versions.iter())
        .flat_map(|v| v.resources.iter())
        .collect();
    let verb = |r: &ResourceDiscovery, name: &str| r.verbs.iter().find(|v| *v == name).map(|v| at(v));
    let gets: BTreeSet<*const u8> = resources.iter().filter_map(|r| verb(r, "get")).collect();
    assert!(resources.len() > 50, "{}", resources.len());
    assert_eq!(gets.len(), 1, "every resource's \"get\" is one block");
    let scopes: BTreeSet<*const u8> = resources.iter().map(|r| at(&r.scope)).collect();
    assert!(scopes.len() <= 2, "Namespaced and Cluster: {}", scopes.len());
    // A resource's kind and its status subresource's kind are one block too.
    let kinds_shared = resources.iter().any(|r| {
        let kind = r.response_kind.as_ref().map(|k| at(&k.kind));
        r.subresources
            .iter()
            .any(|s| s.response_kind.as_ref().map(|k| at(&k.kind)) == kind)
    });
    assert!(kinds_shared);
    // Equal verb lists are one block too: a document has a few distinct ones.
    let lists: BTreeSet<*const u8> = resources.iter().map(|r| r.verbs.as_ptr().cast()).collect();
    let distinct: BTreeSet<Vec<String>> = resources
        .iter()
        .map(|r| r.verbs.iter().map(|v| v.to_string()).collect())
        .collect();
    assert_eq!(lists.len(), distinct.len());
    assert!(lists.len() * 4 < resources.len(), "{} lists", lists.len());
    // The pool lives only for one parse: a second parse shares nothing with the first.
    let again = parse_aggregated(&body).expect("1.37 again");
    let first = |l: &GroupDiscoveryList| l.items.first().map(|g| at(&g.metadata.name));
    assert_ne!(first(&list), first(&again));
    // Sharing changes nothing on the wire.
    assert_eq!(to_v2_json(&list.items), to_v2_json(&again.items));
    let value = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).expect("json");
    let mut original = value(&body);
    if let Some(o) = original.as_object_mut() {
        o.insert("apiVersion".into(), "apidiscovery.k8s.io/v2".into());
    }
    assert_eq!(value(&to_v2_json(&list.items)).get("items"), original.get("items"));
}

#[test]
fn every_list_of_a_parsed_document_is_exactly_its_length() {
    // The discovery service keeps every member's parsed document: spare capacity left by the
    // parser's growth would be held for as long as the member exists.
    for body in [fixture(AGG_133), fixture(AGG_137)] {
        let list = parse_aggregated(&body).expect("fixture");
        let mut lists = 0usize;
        let mut check = |what: &str, len: usize, cap: usize| {
            lists += 1;
            assert_eq!(len, cap, "{what}: {len} items in room for {cap}");
        };
        check("items", list.items.len(), list.items.capacity());
        for g in &list.items {
            check("versions", g.versions.len(), g.versions.capacity());
            for v in &g.versions {
                check("resources", v.resources.len(), v.resources.capacity());
                for r in &v.resources {
                    check("subresources", r.subresources.len(), r.subresources.capacity());
                    for s in &r.subresources {
                        check("acceptedTypes", s.accepted_types.len(), s.accepted_types.capacity());
                    }
                }
            }
        }
        assert!(lists > 100, "{lists}");
    }
}

#[test]
fn groups_equal_to_another_members_are_shared_and_others_are_not() {
    // Two members: one on 1.33, one on 1.37; a third parse of 1.37 shares every group with the
    // 1.37 member (the first of the documents given: of equal groups, the first is kept), and
    // with the 1.33 member only the groups both versions serve alike.
    let (old_body, new_body) = (fixture(AGG_133), fixture(AGG_137));
    let old = parse_aggregated(&old_body).expect("1.33").items;
    let new = parse_aggregated(&new_body).expect("1.37").items;
    let again = documents::sharing([new.as_slice(), old.as_slice()], || parse_aggregated(&new_body))
        .expect("1.37 again")
        .items;
    assert_eq!(again, new);
    assert!(again.iter().zip(&new).all(|(a, n)| a.versions.ptr_eq(&n.versions)));
    let with_old = documents::sharing([old.as_slice()], || parse_aggregated(&new_body))
        .expect("1.37, sharing with 1.33")
        .items;
    let shared = |g: &GroupDiscovery| old.iter().any(|o| o.versions.ptr_eq(&g.versions));
    let alike = |g: &GroupDiscovery| old.iter().any(|o| o.metadata == g.metadata && o.versions == g.versions);
    let (n_shared, n_alike) = (
        with_old.iter().filter(|g| shared(g)).count(),
        with_old.iter().filter(|g| alike(g)).count(),
    );
    assert_eq!(n_shared, n_alike, "every group served alike is shared, and only those");
    assert!(
        n_shared > 5 && n_shared < with_old.len(),
        "{n_shared} of {}",
        with_old.len()
    );
    // Sharing changes nothing on the wire, and outside `sharing` nothing is shared.
    assert_eq!(to_v2_json(&with_old), to_v2_json(&new));
    let plain = parse_aggregated(&new_body).expect("1.37 plain").items;
    assert!(plain.iter().zip(&new).all(|(a, n)| !a.versions.ptr_eq(&n.versions)));
}
