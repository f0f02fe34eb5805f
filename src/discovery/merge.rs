//! Peer-aggregated discovery: the union of every member's last-known discovery document, built like
//! upstream's `peer_aggregated_handler.go` (`staging/src/k8s.io/apiserver/pkg/endpoints/discovery/aggregated/peer_aggregated_handler.go`):
//! servers in name order, the local one not privileged, so every node builds the same bytes.
//! Deliberate differences from upstream are listed on [`merge_version`] and in the README.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use serde::Serialize;

use super::documents::{
    GroupDiscovery, GroupMeta, LegacyGroup, ResourceDiscovery, Str, SubresourceDiscovery, VersionDiscovery,
};

/// A merged group that borrows from the servers' documents: only a resource that two servers
/// describe differently is copied (see [`merge_resource`]), so merging large documents does not
/// copy them. Serializes exactly as [`GroupDiscovery`] does.
#[derive(Debug, Clone, Serialize)]
pub struct MergedGroup<'a> {
    pub metadata: &'a GroupMeta,
    pub versions: Vec<MergedVersion<'a>>,
}

/// A merged group's entry in the legacy `APIGroupList` (here, not in `documents`, so the documents
/// do not depend on the merge).
impl<'a> From<&MergedGroup<'a>> for LegacyGroup<'a> {
    fn from(g: &MergedGroup<'a>) -> LegacyGroup<'a> {
        LegacyGroup {
            name: &g.metadata.name,
            versions: g.versions.iter().filter(|v| !v.is_stale()).map(|v| v.version).collect(),
        }
    }
}

/// Serializes exactly as [`VersionDiscovery`] does (same field order and omitempty rules).
#[derive(Debug, Clone, Serialize)]
pub struct MergedVersion<'a> {
    pub version: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<Cow<'a, ResourceDiscovery>>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub freshness: &'a str,
}

impl MergedVersion<'_> {
    pub fn is_stale(&self) -> bool {
        self.freshness == "Stale"
    }
}

impl<'a> MergedVersion<'a> {
    fn of(v: &'a VersionDiscovery) -> MergedVersion<'a> {
        MergedVersion {
            version: &v.version,
            resources: v.resources.iter().map(Cow::Borrowed).collect(),
            freshness: &v.freshness,
        }
    }
}

impl MergedGroup<'_> {
    /// An owned copy (tests and tools; the discovery service serializes the view itself).
    pub fn to_owned_group(&self) -> GroupDiscovery {
        GroupDiscovery {
            metadata: self.metadata.clone(),
            versions: self
                .versions
                .iter()
                .map(|v| VersionDiscovery {
                    version: v.version.into(),
                    resources: v.resources.iter().map(|r| r.clone().into_owned()).collect(),
                    freshness: v.freshness.into(),
                })
                .collect(),
        }
    }
}

/// Merges group lists given in precedence order (servers sorted by name), as owned documents.
pub fn merge_groups(servers: &[&[GroupDiscovery]]) -> Vec<GroupDiscovery> {
    merge_group_views(servers)
        .iter()
        .map(MergedGroup::to_owned_group)
        .collect()
}

/// Merges group lists given in precedence order (servers sorted by name), borrowing from them.
pub fn merge_group_views<'a>(servers: &[&'a [GroupDiscovery]]) -> Vec<MergedGroup<'a>> {
    let mut merged: HashMap<&str, MergedGroup<'a>> = HashMap::new();
    let mut orders: Vec<Vec<&str>> = Vec::new();
    for groups in servers {
        let mut order = Vec::new();
        for g in groups.iter() {
            let name = g.metadata.name.as_str();
            order.push(name);
            match merged.get_mut(name) {
                Some(existing) => merge_group(existing, g),
                None => {
                    merged.insert(
                        name,
                        MergedGroup {
                            metadata: &g.metadata,
                            versions: g.versions.iter().map(MergedVersion::of).collect(),
                        },
                    );
                }
            }
        }
        orders.push(order);
    }
    merge_preserving_relative_order(&orders)
        .into_iter()
        .filter_map(|name| merged.remove(name))
        .collect()
}

fn merge_group<'a>(a: &mut MergedGroup<'a>, b: &'a GroupDiscovery) {
    let a_order: Vec<&str> = a.versions.iter().map(|v| v.version).collect();
    let b_order: Vec<&str> = b.versions.iter().map(|v| v.version.as_str()).collect();
    for bv in &b.versions {
        match a.versions.iter_mut().find(|v| v.version == bv.version) {
            Some(av) => merge_version(av, bv),
            None => a.versions.push(MergedVersion::of(bv)),
        }
    }
    if a_order != b_order {
        let order = merge_preserving_relative_order(&[a_order, b_order]);
        let order: Vec<String> = order.into_iter().map(str::to_string).collect();
        reorder(&mut a.versions, &borrow(&order), |v| v.version);
    }
}

/// Differs from upstream on purpose: a version one server serves currently stays current in the
/// merge even if an earlier server reports it Stale (upstream keeps the first server's freshness,
/// which hides a version from clients while a newer server already serves it).
fn merge_version<'a>(a: &mut MergedVersion<'a>, b: &'a VersionDiscovery) {
    if a.is_stale() && !b.is_stale() {
        a.freshness = &b.freshness;
    }
    let a_order: Vec<Str> = a.resources.iter().map(|r| r.resource.clone()).collect();
    let b_order: Vec<&str> = b.resources.iter().map(|r| r.resource.as_str()).collect();
    for br in &b.resources {
        match a.resources.iter_mut().find(|r| r.resource == br.resource) {
            Some(ar) if **ar == *br => {}
            Some(ar) => merge_resource(ar.to_mut(), br),
            None => a.resources.push(Cow::Borrowed(br)),
        }
    }
    let a_order = borrow(&a_order);
    if a_order != b_order {
        let order = merge_preserving_relative_order(&[a_order, b_order]);
        let order: Vec<String> = order.into_iter().map(str::to_string).collect();
        reorder(&mut a.resources, &borrow(&order), |r| r.resource.as_str());
    }
}

/// Verbs: sorted union. Subresources: union by name (the first server wins), sorted by name.
/// Everything else comes from the first server, or from the second where the first has nothing.
fn merge_resource(a: &mut ResourceDiscovery, b: &ResourceDiscovery) {
    let verbs: BTreeSet<Str> = a.verbs.iter().chain(b.verbs.iter()).cloned().collect();
    a.verbs = verbs.into_iter().collect();
    let mut subs: BTreeMap<Str, SubresourceDiscovery> = BTreeMap::new();
    for s in b.subresources.iter().chain(a.subresources.iter()) {
        subs.insert(s.subresource.clone(), s.clone());
    }
    a.subresources = subs.into_values().collect();
    if a.response_kind.is_none() {
        a.response_kind = b.response_kind.clone();
    }
    if a.scope.is_empty() {
        a.scope = b.scope.clone();
    }
    if a.singular_resource.is_empty() {
        a.singular_resource = b.singular_resource.clone();
    }
    if a.short_names.is_empty() {
        a.short_names = b.short_names.clone();
    }
    if a.categories.is_empty() {
        a.categories = b.categories.clone();
    }
}

fn borrow<S: AsRef<str>>(v: &[S]) -> Vec<&str> {
    v.iter().map(AsRef::as_ref).collect()
}

fn reorder<T>(items: &mut [T], order: &[&str], key: impl Fn(&T) -> &str) {
    let rank: HashMap<String, usize> = order.iter().enumerate().map(|(i, k)| (k.to_string(), i)).collect();
    items.sort_by_key(|it| rank.get(key(it)).copied().unwrap_or(usize::MAX));
}

/// apimachinery `util/sort.MergePreservingRelativeOrder`: if some input list is duplicate-free
/// and contains every item, it wins (first such list); otherwise a topological sort of the
/// "comes before" edges with lexicographic tie-break; on a cycle, plain lexicographic order.
pub fn merge_preserving_relative_order<'a>(lists: &[Vec<&'a str>]) -> Vec<&'a str> {
    let all: BTreeSet<&'a str> = lists.iter().flatten().copied().collect();
    for l in lists {
        let unique: BTreeSet<&str> = l.iter().copied().collect();
        if unique.len() == l.len() && unique.len() == all.len() {
            return l.clone();
        }
    }
    let mut indegree: BTreeMap<&'a str, usize> = all.iter().map(|k| (*k, 0)).collect();
    let mut edges: BTreeMap<&'a str, BTreeSet<&'a str>> = BTreeMap::new();
    for l in lists {
        for w in l.windows(2) {
            if let [from, to] = w {
                if from != to && edges.entry(from).or_default().insert(to) {
                    *indegree.entry(to).or_default() += 1;
                }
            }
        }
    }
    let mut heap: BinaryHeap<Reverse<&'a str>> = indegree
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(k, _)| Reverse(*k))
        .collect();
    let mut out = Vec::with_capacity(all.len());
    while let Some(Reverse(k)) = heap.pop() {
        out.push(k);
        for next in edges.get(k).into_iter().flatten() {
            if let Some(d) = indegree.get_mut(next) {
                *d -= 1;
                if *d == 0 {
                    heap.push(Reverse(*next));
                }
            }
        }
    }
    if out.len() != all.len() {
        return all.into_iter().collect();
    }
    out
}
