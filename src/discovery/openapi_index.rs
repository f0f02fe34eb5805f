//! The OpenAPI v3 index, `GET /openapi/v3`: the group versions a legacy-only member serves.
//!
//! Upstream: `k8s.io/kube-openapi` `pkg/handler3/handler.go` (vendored in kubernetes at
//! `vendor/k8s.io/kube-openapi/`, not under `staging/`; `HandleDiscovery`, the
//! `OpenAPIV3Discovery{Paths map[string]OpenAPIV3DiscoveryGroupVersion}` document, GA since 1.27):
//! `{"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=..."}, "apis/apps/v1": {...},
//! "version": {...}, ...}}`.
//!
//! Why: a legacy member's `/apis` `APIGroupList` is built by its aggregator from the APIService
//! objects in the shared etcd, and each server's autoregister controller deletes the APIServices of
//! group versions it does not serve. During an upgrade the newer server deletes one only the older
//! server serves (`v1beta1.admissionregistration.k8s.io`), which then vanishes from the older
//! server's `APIGroupList` although it still serves it. The OpenAPI index comes from the server's
//! own handlers, so the walk takes the union of both (aggregated APIServices of remote backends
//! are listed too: they are served through that server).
//!
//! Only keys `api/<v>` and `apis/<g>/<v>` are group versions; others (`version`, `logs`, `apis`,
//! `.well-known/openid-configuration`, ...) and names that could not be a group or version are
//! ignored.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Deserialize)]
struct Index {
    paths: BTreeMap<String, IgnoredAny>,
}

/// The index's group versions, `("", v)` for the core group: groups by name, each group's versions
/// in Kubernetes' priority order (GA, beta, alpha; see [`kube_version_order`]). A body that is not
/// an object with a `paths` object is an error.
pub fn parse_openapi_index(body: &[u8]) -> Result<Vec<(String, String)>, String> {
    let index: Index = serde_json::from_slice(body).map_err(|e| format!("invalid OpenAPI v3 index: {e}"))?;
    let mut gvs: Vec<(String, String)> = index
        .paths
        .keys()
        .filter_map(|k| {
            let segments: Vec<&str> = k.split('/').collect();
            let (g, v) = match segments.as_slice() {
                ["api", v] => ("", *v),
                ["apis", g, v] if is_group(g) => (*g, *v),
                _ => return None,
            };
            is_version(v).then(|| (g.to_string(), v.to_string()))
        })
        .collect();
    gvs.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| kube_version_order(&a.1, &b.1)));
    Ok(gvs)
}

/// A DNS subdomain's characters (group names are DNS subdomains).
fn is_group(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= 253
        && g.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A DNS label's characters (versions are DNS-1035 labels).
fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// `^v(\d+)(?:(alpha|beta)(\d+))?$` as (stage: GA 2, beta 1, alpha 0; major; minor).
fn kube_version(v: &str) -> Option<(u8, u64, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (major, rest) = rest.split_at(digits);
    let major: u64 = major.parse().ok()?;
    if rest.is_empty() {
        return Some((2, major, 0));
    }
    let (stage, minor) = if let Some(m) = rest.strip_prefix("beta") {
        (1, m)
    } else {
        (0, rest.strip_prefix("alpha")?)
    };
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stage, major, minor.parse().ok()?))
}

/// Upstream `version.CompareKubeAwareVersionStrings` (`staging/src/k8s.io/apimachinery/pkg/version/helpers.go`)
/// as a sort order, highest priority first: Kubernetes-like versions (GA, then beta, then alpha;
/// higher major, then higher minor first), then the others in lexical order.
pub fn kube_version_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (kube_version(a), kube_version(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_versions_of_a_real_index() {
        let body = br#"{"paths":{
            ".well-known/openid-configuration":{"serverRelativeURL":"/openapi/v3/.well-known/openid-configuration?hash=A"},
            "api":{"serverRelativeURL":"/openapi/v3/api?hash=B"},
            "api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=C"},
            "apis":{"serverRelativeURL":"/openapi/v3/apis?hash=D"},
            "apis/admissionregistration.k8s.io":{"serverRelativeURL":"/openapi/v3/apis/admissionregistration.k8s.io?hash=E"},
            "apis/admissionregistration.k8s.io/v1":{"serverRelativeURL":"/openapi/v3/apis/admissionregistration.k8s.io/v1?hash=F"},
            "apis/admissionregistration.k8s.io/v1alpha1":{"serverRelativeURL":"x"},
            "apis/admissionregistration.k8s.io/v1beta1":{"serverRelativeURL":"x"},
            "apis/apps/v1":{"serverRelativeURL":"x"},
            "apis/wardle.example/v1alpha1":{"serverRelativeURL":"x"},
            "apis/Bad_Group/v1":{}, "apis/a/b/c":{}, "apis/x/V1":{}, "api/":{},
            "logs":{"serverRelativeURL":"x"}, "version":{"serverRelativeURL":"x"}}}"#;
        let got = parse_openapi_index(body).expect("index");
        let want: Vec<(String, String)> = [
            ("", "v1"),
            ("admissionregistration.k8s.io", "v1"),
            ("admissionregistration.k8s.io", "v1beta1"),
            ("admissionregistration.k8s.io", "v1alpha1"),
            ("apps", "v1"),
            ("wardle.example", "v1alpha1"),
        ]
        .iter()
        .map(|(g, v)| (g.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn malformed_indexes_are_errors() {
        for body in [
            &b""[..],
            b"null",
            b"[]",
            b"{}",
            br#"{"paths":[]}"#,
            br#"{"paths":{"api/v1":"#,
        ] {
            assert!(parse_openapi_index(body).is_err(), "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(parse_openapi_index(br#"{"paths":{}}"#), Ok(Vec::new()));
    }

    #[test]
    fn versions_in_kubernetes_priority_order() {
        let mut v = vec![
            "v1alpha1",
            "foo",
            "v2",
            "v1beta2",
            "v1",
            "v10beta1",
            "v1beta1",
            "bar",
            "v11alpha2",
            "vx",
        ];
        v.sort_by(|a, b| kube_version_order(a, b));
        assert_eq!(
            v,
            [
                "v2",
                "v1",
                "v10beta1",
                "v1beta2",
                "v1beta1",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo",
                "vx"
            ]
        );
    }
}
