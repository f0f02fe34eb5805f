//! Discovery documents: aggregated discovery (`apidiscovery.k8s.io` v2 and v2beta1) and the legacy
//! `APIVersions` / `APIGroupList` / `APIResourceList` formats, parsed into one model.
//!
//! Field order and `omitempty` rules follow the Go types in `k8s.io/api/apidiscovery/v2`, so a
//! document we re-serialize (the merged `/apis`) looks like one an apiserver would send.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ops::Deref;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

pub use super::interned::{Str, Strs};

fn is_empty(s: &Str) -> bool {
    s.is_empty()
}

/// A list without the spare capacity serde's growth leaves (it cannot know a list's length in
/// advance: a one-element list, a resource's single `status` subresource, gets room for four),
/// given back as soon as the list is parsed. The discovery service keeps every member's document;
/// shrinking each list right away, while its block is still the allocator's newest, frees the
/// tail in place, where shrinking the whole document afterwards left a hole behind every list
/// that the VM's linear memory (which never shrinks) kept for good (`bench/mem_probe.py`).
fn compact<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let mut v = Vec::<T>::deserialize(d)?;
    v.shrink_to_fit();
    Ok(v)
}

pub const CONTENT_TYPE_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// `apidiscovery.k8s.io/v2 APIGroupDiscoveryList` (v2beta1 is field-for-field identical).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GroupDiscoveryList {
    #[serde(default)]
    pub kind: Str,
    #[serde(rename = "apiVersion", default)]
    pub api_version: Str,
    #[serde(default)]
    pub metadata: Empty,
    #[serde(default, deserialize_with = "compact")]
    pub items: Vec<GroupDiscovery>,
}

/// `metadata: {}` on the list; any content is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Empty {}

impl<'de> Deserialize<'de> for Empty {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Empty {})
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GroupDiscovery {
    #[serde(default)]
    pub metadata: GroupMeta,
    #[serde(default)]
    pub versions: Versions,
}

/// A group's versions, shared between the documents of members that serve the group alike.
///
/// Every apiserver of a cluster serves the same CRDs, so with thousands of them most of each
/// member's document is the same as the others'. Parsed inside [`sharing`], a group whose
/// versions equal those of a group in the documents given is not kept twice: the discovery
/// service holds one copy of what its members have in common, not one per member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Versions(Rc<Vec<VersionDiscovery>>);

impl Versions {
    /// The list to change (copied first if it is shared).
    pub fn make_mut(&mut self) -> &mut Vec<VersionDiscovery> {
        Rc::make_mut(&mut self.0)
    }

    /// Whether `self` and `other` are one block (shared), not only equal.
    pub fn ptr_eq(&self, other: &Versions) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for Versions {
    type Target = Vec<VersionDiscovery>;
    fn deref(&self) -> &Vec<VersionDiscovery> {
        &self.0
    }
}

impl From<Vec<VersionDiscovery>> for Versions {
    fn from(v: Vec<VersionDiscovery>) -> Versions {
        Versions(Rc::new(v))
    }
}

impl FromIterator<VersionDiscovery> for Versions {
    fn from_iter<I: IntoIterator<Item = VersionDiscovery>>(i: I) -> Versions {
        Versions::from(i.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Versions {
    type Item = &'a VersionDiscovery;
    type IntoIter = std::slice::Iter<'a, VersionDiscovery>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Serialize for Versions {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

thread_local! {
    /// The versions a running [`sharing`] parse may share (see [`Versions`]).
    static SHARE: RefCell<Option<HashSet<Versions>>> = const { RefCell::new(None) };
}

impl<'de> Deserialize<'de> for Versions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let parsed = Versions::from(compact::<D, VersionDiscovery>(d)?);
        Ok(SHARE.with(|p| {
            p.borrow()
                .as_ref()
                .and_then(|pool| pool.get(&parsed).cloned())
                .unwrap_or(parsed)
        }))
    }
}

/// Runs `f` (a parse) so that every group's versions equal to a group's in `documents` are that
/// group's, shared, instead of a copy. The pool lives only for the call.
pub fn sharing<'a, T>(documents: impl IntoIterator<Item = &'a [GroupDiscovery]>, f: impl FnOnce() -> T) -> T {
    let pool: HashSet<Versions> = documents
        .into_iter()
        .flat_map(|d| d.iter().map(|g| g.versions.clone()))
        .collect();
    let outer = SHARE.with(|p| p.borrow_mut().replace(pool));
    let out = f();
    SHARE.with(|p| *p.borrow_mut() = outer);
    out
}

/// Only `name` of the item's ObjectMeta matters (empty for the core group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GroupMeta {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub name: Str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct VersionDiscovery {
    #[serde(default)]
    pub version: Str,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "compact")]
    pub resources: Vec<ResourceDiscovery>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub freshness: Str,
}

impl VersionDiscovery {
    /// Stale versions (an aggregated API whose backend is unreachable) are not served.
    pub fn is_stale(&self) -> bool {
        self.freshness == "Stale"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Gvk {
    #[serde(default)]
    pub group: Str,
    #[serde(default)]
    pub version: Str,
    #[serde(default)]
    pub kind: Str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct ResourceDiscovery {
    #[serde(default)]
    pub resource: Str,
    #[serde(rename = "responseKind", default, skip_serializing_if = "Option::is_none")]
    pub response_kind: Option<Gvk>,
    #[serde(default)]
    pub scope: Str,
    #[serde(rename = "singularResource", default)]
    pub singular_resource: Str,
    #[serde(default)]
    pub verbs: Strs,
    #[serde(rename = "shortNames", default, skip_serializing_if = "Strs::is_empty")]
    pub short_names: Strs,
    #[serde(default, skip_serializing_if = "Strs::is_empty")]
    pub categories: Strs,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "compact")]
    pub subresources: Vec<SubresourceDiscovery>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct SubresourceDiscovery {
    #[serde(default)]
    pub subresource: Str,
    #[serde(rename = "responseKind", default, skip_serializing_if = "Option::is_none")]
    pub response_kind: Option<Gvk>,
    #[serde(
        rename = "acceptedTypes",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "compact"
    )]
    pub accepted_types: Vec<Gvk>,
    #[serde(default)]
    pub verbs: Strs,
}

/// Legacy `APIVersions` (`GET /api`).
#[derive(Debug, Deserialize)]
pub struct ApiVersions {
    #[serde(default)]
    pub versions: Vec<String>,
}

/// Legacy `APIGroupList` (`GET /apis`).
#[derive(Debug, Deserialize)]
pub struct ApiGroupList {
    #[serde(default)]
    pub groups: Vec<ApiGroup>,
}

/// Legacy `APIGroup` (`GET /apis/<g>` and items of `APIGroupList`).
#[derive(Debug, Deserialize)]
pub struct ApiGroup {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub versions: Vec<GroupVersionForDiscovery>,
}

#[derive(Debug, Deserialize)]
pub struct GroupVersionForDiscovery {
    #[serde(default)]
    pub version: String,
}

/// Legacy `APIResourceList` (`GET /api/v1`, `GET /apis/<g>/<v>`); subresources are `res/sub`.
#[derive(Debug, Deserialize)]
pub struct ApiResourceList {
    #[serde(default)]
    pub resources: Vec<ApiResource>,
}

#[derive(Debug, Deserialize)]
pub struct ApiResource {
    pub name: Str,
    #[serde(rename = "singularName", default)]
    pub singular_name: Str,
    #[serde(default)]
    pub namespaced: bool,
    #[serde(default)]
    pub group: Str,
    #[serde(default)]
    pub version: Str,
    #[serde(default)]
    pub kind: Str,
    #[serde(default, deserialize_with = "compact")]
    pub verbs: Vec<Str>,
    #[serde(rename = "shortNames", default)]
    pub short_names: Vec<Str>,
    #[serde(default)]
    pub categories: Vec<Str>,
}

/// Why a discovery document was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    Json(String),
    WrongKind(String),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Json(e) => write!(f, "invalid JSON: {e}"),
            ParseError::WrongKind(k) => write!(f, "unexpected kind {k:?}"),
        }
    }
}

/// Which document format a response carries, judged like client-go's `ContentTypeIsGVK`:
/// base `application/json` with `g=apidiscovery.k8s.io` and `as=APIGroupDiscoveryList`.
pub fn is_aggregated_content_type(content_type: &str) -> bool {
    let mut parts = content_type.split(';').map(str::trim);
    let base = parts.next().unwrap_or("");
    if !base.eq_ignore_ascii_case("application/json") {
        return false;
    }
    let (mut g, mut v, mut as_) = (false, false, false);
    for p in parts {
        match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("g", "apidiscovery.k8s.io")) => g = true,
            Some(("v", "v2" | "v2beta1")) => v = true,
            Some(("as", "APIGroupDiscoveryList")) => as_ = true,
            _ => {}
        }
    }
    g && v && as_
}

/// The version of an aggregated discovery media type this filter does not read (`g=apidiscovery.k8s.io`,
/// `as=APIGroupDiscoveryList`, a `v` other than v2 and v2beta1, such as a future v3), `None` for
/// every other content type. A document in it is rejected with that said, rather than misread as a
/// legacy document.
pub fn unsupported_aggregated_version(content_type: &str) -> Option<&str> {
    let mut parts = content_type.split(';').map(str::trim);
    if !parts.next().unwrap_or("").eq_ignore_ascii_case("application/json") {
        return None;
    }
    let (mut g, mut v, mut as_) = (false, None, false);
    for p in parts {
        match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("g", "apidiscovery.k8s.io")) => g = true,
            Some(("v", version)) => v = Some(version),
            Some(("as", "APIGroupDiscoveryList")) => as_ = true,
            _ => {}
        }
    }
    v.filter(|v| g && as_ && !matches!(*v, "v2" | "v2beta1"))
}

/// Parses an aggregated discovery list (v2 or v2beta1).
pub fn parse_aggregated(body: &[u8]) -> Result<GroupDiscoveryList, ParseError> {
    // Interned: equal strings of the document share one heap block (see `interned`).
    checked(super::interned::interning(|| serde_json::from_slice(body)))
}

/// [`parse_aggregated`] of a document read in pieces (see [`crate::discovery::sync::Body`]).
pub fn parse_aggregated_from(body: impl std::io::Read) -> Result<GroupDiscoveryList, ParseError> {
    checked(super::interned::interning(|| serde_json::from_reader(body)))
}

fn checked(parsed: Result<GroupDiscoveryList, serde_json::Error>) -> Result<GroupDiscoveryList, ParseError> {
    let list = parsed.map_err(|e| ParseError::Json(e.to_string()))?;
    if list.kind != "APIGroupDiscoveryList" {
        return Err(ParseError::WrongKind(list.kind.to_string()));
    }
    Ok(list)
}

pub fn parse_api_versions(body: &[u8]) -> Result<ApiVersions, ParseError> {
    parse_legacy(body, "APIVersions", "versions")
}

pub fn parse_group_list(body: &[u8]) -> Result<ApiGroupList, ParseError> {
    parse_legacy(body, "APIGroupList", "groups")
}

pub fn parse_group(body: &[u8]) -> Result<ApiGroup, ParseError> {
    parse_legacy(body, "APIGroup", "versions")
}

pub fn parse_resource_list(body: &[u8]) -> Result<ApiResourceList, ParseError> {
    parse_legacy(body, "APIResourceList", "resources")
}

/// A legacy document of `kind`, whose main list is `field` (see [`expect_kind`]).
fn parse_legacy<T: serde::de::DeserializeOwned>(body: &[u8], kind: &str, field: &str) -> Result<T, ParseError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))?;
    expect_kind(&v, kind, field)?;
    super::interned::interning(|| serde_json::from_value(v)).map_err(|e| ParseError::Json(e.to_string()))
}

fn expect_kind(v: &serde_json::Value, kind: &str, field: &str) -> Result<(), ParseError> {
    match v.get("kind").and_then(|k| k.as_str()) {
        Some(k) if k == kind => Ok(()),
        // The core `/api/v1` golden file has no apiVersion but does have kind; tolerate a missing
        // kind only when the object has the fields of the expected type.
        None if v.get(field).is_some() => Ok(()),
        other => Err(ParseError::WrongKind(other.unwrap_or("").to_string())),
    }
}

/// Converts a legacy `APIResourceList` of one group version into the aggregated model
/// (client-go's `SplitGroupsAndResources` in reverse): `res/sub` entries become subresources.
pub fn version_from_legacy(version: &str, list: &ApiResourceList) -> VersionDiscovery {
    let mut resources: Vec<ResourceDiscovery> = Vec::new();
    for r in list.resources.iter().filter(|r| !r.name.contains('/')) {
        resources.push(ResourceDiscovery {
            resource: r.name.clone(),
            response_kind: Some(Gvk {
                group: r.group.clone(),
                version: r.version.clone(),
                kind: r.kind.clone(),
            }),
            scope: if r.namespaced { "Namespaced" } else { "Cluster" }.into(),
            singular_resource: r.singular_name.clone(),
            verbs: r.verbs.clone().into(),
            short_names: r.short_names.clone().into(),
            categories: r.categories.clone().into(),
            subresources: Vec::new(),
        });
    }
    for r in &list.resources {
        let Some((parent, sub)) = r.name.split_once('/') else {
            continue;
        };
        let sub = SubresourceDiscovery {
            subresource: sub.into(),
            response_kind: Some(Gvk {
                group: r.group.clone(),
                version: r.version.clone(),
                kind: r.kind.clone(),
            }),
            accepted_types: Vec::new(),
            verbs: r.verbs.clone().into(),
        };
        match resources.iter_mut().find(|p| p.resource == parent) {
            Some(p) => p.subresources.push(sub),
            // A subresource listed without its parent still tells us the path is served.
            None => resources.push(ResourceDiscovery {
                resource: parent.into(),
                subresources: vec![sub],
                ..Default::default()
            }),
        }
    }
    VersionDiscovery {
        version: version.into(),
        resources,
        freshness: "Current".into(),
    }
}

/// Serializes a list as an apiserver would send it (`kind`/`apiVersion` set to v2): owned groups or
/// the merge's borrowed views (anything that serializes as a group does).
/// Sized exactly (a counting pass first), so a large document is not left in a buffer grown by
/// doubling.
pub fn to_v2_json<T: Serialize>(items: &[T]) -> Vec<u8> {
    to_vec_exact(&v2_list(items))
}

/// [`to_v2_json`] written to `w` as it is serialized, with no buffer of the whole (the discovery
/// service writes a large merged document straight into its shared-data pieces). False if `w`
/// failed.
pub fn write_v2_json<T: Serialize>(items: &[T], w: &mut dyn std::io::Write) -> bool {
    serde_json::to_writer(w, &v2_list(items)).is_ok()
}

#[derive(Serialize)]
struct V2List<'a, T> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: Empty,
    items: &'a [T],
}

fn v2_list<T>(items: &[T]) -> V2List<'_, T> {
    V2List {
        kind: "APIGroupDiscoveryList",
        api_version: "apidiscovery.k8s.io/v2",
        metadata: Empty {},
        items,
    }
}

/// Bytes a serialization would write, counted without keeping them.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// JSON of `value` in a buffer of exactly its size (a counting pass first).
pub(crate) fn to_vec_exact<T: Serialize>(value: &T) -> Vec<u8> {
    // One writer type for both passes: the serializer is instantiated once per value type.
    fn write<T: Serialize>(w: &mut dyn std::io::Write, value: &T) -> bool {
        serde_json::to_writer(w, value).is_ok()
    }
    let mut count = Count(0);
    if !write(&mut count, value) {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(count.0);
    if !write(&mut out, value) {
        return Vec::new();
    }
    out
}

/// One group of the legacy list: its name and versions in preference order, stale ones removed.
pub struct LegacyGroup<'a> {
    pub name: &'a str,
    pub versions: Vec<&'a str>,
}

impl<'a> From<&'a GroupDiscovery> for LegacyGroup<'a> {
    fn from(g: &'a GroupDiscovery) -> LegacyGroup<'a> {
        LegacyGroup {
            name: &g.metadata.name,
            versions: g
                .versions
                .iter()
                .filter(|v| !v.is_stale())
                .map(|v| v.version.as_str())
                .collect(),
        }
    }
}

/// The legacy `APIGroupList` (`GET /apis` with plain JSON) equivalent of an aggregated group list:
/// non-stale versions in preference order, the first one preferred (client-go's mapping).
pub fn to_legacy_group_list_json(items: &[GroupDiscovery]) -> Vec<u8> {
    legacy_group_list_json(items.iter().map(LegacyGroup::from).collect())
}

/// [`to_legacy_group_list_json`] of groups already reduced to [`LegacyGroup`]s.
pub fn legacy_group_list_json(items: Vec<LegacyGroup>) -> Vec<u8> {
    to_vec_exact(&legacy_list(&items))
}

/// [`legacy_group_list_json`] written to `w` (see [`write_v2_json`]).
pub fn write_legacy_group_list(items: Vec<LegacyGroup>, w: &mut dyn std::io::Write) -> bool {
    serde_json::to_writer(w, &legacy_list(&items)).is_ok()
}

#[derive(Serialize)]
struct Gv<'a> {
    #[serde(rename = "groupVersion")]
    group_version: String,
    version: &'a str,
}

#[derive(Serialize)]
struct Group<'a> {
    name: &'a str,
    versions: Vec<Gv<'a>>,
    #[serde(rename = "preferredVersion")]
    preferred_version: Gv<'a>,
}

#[derive(Serialize)]
struct List<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    groups: Vec<Group<'a>>,
}

fn legacy_list<'a>(items: &'a [LegacyGroup<'a>]) -> List<'a> {
    fn gv<'a>(group: &str, version: &'a str) -> Gv<'a> {
        Gv {
            group_version: format!("{group}/{version}"),
            version,
        }
    }
    let groups = items
        .iter()
        .filter(|g| !g.name.is_empty())
        .filter_map(|g| {
            let first = *g.versions.first()?;
            Some(Group {
                name: g.name,
                versions: g.versions.iter().map(|v| gv(g.name, v)).collect(),
                preferred_version: gv(g.name, first),
            })
        })
        .collect();
    List {
        kind: "APIGroupList",
        api_version: "v1",
        groups,
    }
}
