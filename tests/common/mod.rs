//! Helpers shared by the integration tests: fixture loading and small discovery builders.
#![allow(dead_code)]
#![cfg(test)]

use kube_peer_proxy::discovery::documents::{
    GroupDiscovery, GroupMeta, Gvk, ResourceDiscovery, Str, SubresourceDiscovery, VersionDiscovery,
};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/k8s-discovery/");

pub const AGG_133: &str = "aggregated_v2.k8s-1.33.json";
pub const AGG_137: &str = "aggregated_v2.k8s-1.37-dev-fork.json";

/// Reads a fixture of `tests/fixtures/k8s-discovery/`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{FIXTURES}{name}");
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

pub fn fixture_json(name: &str) -> serde_json::Value {
    serde_json::from_slice(&fixture(name)).expect("fixture is JSON")
}

pub fn strings(v: &[&str]) -> Vec<Str> {
    v.iter().map(|s| Str::from(*s)).collect()
}

pub fn sub(name: &str, verbs: &[&str]) -> SubresourceDiscovery {
    SubresourceDiscovery {
        subresource: name.into(),
        response_kind: None,
        accepted_types: Vec::new(),
        verbs: strings(verbs).into(),
    }
}

/// A namespaced resource with the usual verbs and the given subresources (verbs get/patch/update).
pub fn res(name: &str, subs: &[&str]) -> ResourceDiscovery {
    ResourceDiscovery {
        resource: name.into(),
        response_kind: Some(Gvk {
            group: Str::default(),
            version: Str::default(),
            kind: "Kind".into(),
        }),
        scope: "Namespaced".into(),
        singular_resource: name.trim_end_matches('s').into(),
        verbs: strings(&["get", "list", "watch"]).into(),
        short_names: Vec::new().into(),
        categories: Vec::new().into(),
        subresources: subs.iter().map(|s| sub(s, &["get", "patch", "update"])).collect(),
    }
}

pub fn ver(version: &str, resources: Vec<ResourceDiscovery>) -> VersionDiscovery {
    VersionDiscovery {
        version: version.into(),
        resources,
        freshness: "Current".into(),
    }
}

pub fn stale(version: &str) -> VersionDiscovery {
    VersionDiscovery {
        version: version.into(),
        resources: Vec::new(),
        freshness: "Stale".into(),
    }
}

pub fn group(name: &str, versions: Vec<VersionDiscovery>) -> GroupDiscovery {
    GroupDiscovery {
        metadata: GroupMeta { name: name.into() },
        versions: versions.into(),
    }
}

/// Every `(group, version, resource)` of non-stale versions of an aggregated list given as JSON.
pub fn json_gvrs(doc: &serde_json::Value) -> std::collections::BTreeSet<(String, String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for item in doc["items"].as_array().expect("items") {
        let g = item["metadata"]["name"].as_str().unwrap_or("").to_string();
        for v in item["versions"].as_array().expect("versions") {
            if v["freshness"].as_str() == Some("Stale") {
                continue;
            }
            let version = v["version"].as_str().expect("version").to_string();
            for r in v["resources"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                out.insert((
                    g.clone(),
                    version.clone(),
                    r["resource"].as_str().expect("resource").to_string(),
                ));
            }
        }
    }
    out
}

/// Every `(group, version, resource, subresource)` of non-stale versions of an aggregated list.
pub fn json_subresources(doc: &serde_json::Value) -> std::collections::BTreeSet<(String, String, String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for item in doc["items"].as_array().expect("items") {
        let g = item["metadata"]["name"].as_str().unwrap_or("").to_string();
        for v in item["versions"].as_array().expect("versions") {
            if v["freshness"].as_str() == Some("Stale") {
                continue;
            }
            let version = v["version"].as_str().expect("version").to_string();
            for r in v["resources"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                let resource = r["resource"].as_str().expect("resource").to_string();
                for s in r["subresources"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                    out.insert((
                        g.clone(),
                        version.clone(),
                        resource.clone(),
                        s["subresource"].as_str().expect("subresource").to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// A resource request as `request_info::parse` returns it.
pub fn resource_request(
    verb: &'static str,
    group: &'static str,
    version: &'static str,
    namespace: &'static str,
    resource: &'static str,
    name: &str,
    subresource: &'static str,
) -> kube_peer_proxy::request::request_info::RequestKind<'static> {
    kube_peer_proxy::request::request_info::RequestKind::Resource(
        kube_peer_proxy::request::request_info::ResourceRequest {
            verb,
            group,
            version,
            namespace,
            resource,
            name: std::borrow::Cow::Owned(name.to_string()),
            subresource,
        },
    )
}

/// A non-resource request as `request_info::parse` returns it.
pub fn non_resource(
    n: kube_peer_proxy::request::request_info::NonResource<'static>,
) -> kube_peer_proxy::request::request_info::RequestKind<'static> {
    kube_peer_proxy::request::request_info::RequestKind::NonResource(n)
}
