//! What each answer adds to a server's round, and the legacy walk: an aggregated list is the part
//! at once; a legacy `APIVersions`/`APIGroupList` is walked through `/api/<v>` and `/apis/<g>/<v>`,
//! with the group versions only the server's OpenAPI v3 index lists (`/openapi/v3`, asked for with
//! the walk: the `APIGroupList` follows the APIService objects every member shares, and another
//! member's autoregister controller may have deleted one this server still serves), and the walk
//! is assembled into groups when the server's last answer is in.

use std::rc::Rc;

use super::{Doc, PartWork, Purpose, Server, Step, SyncError, SyncErrorKind, Syncer, Walked};
use crate::discovery::documents::{GroupDiscovery, GroupMeta};

impl Syncer {
    /// The documents the other servers hold, to share an equal one (see [`super::Part::docs`]).
    pub(super) fn shared_docs(&self, si: usize) -> Vec<Rc<Vec<GroupDiscovery>>> {
        self.servers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != si)
            .flat_map(|(_, o)| [&o.core.docs, &o.groups.docs])
            .flatten()
            .cloned()
            .collect()
    }

    pub(super) fn absorb(&mut self, si: usize, purpose: Purpose, doc: Doc, step: &mut Step) {
        let mut follow: Vec<(String, Purpose)> = Vec::new();
        // The OpenAPI index's answer: `Some(Some(gvs))` a good one, `Some(None)` a failure.
        let mut index: Option<Option<Vec<(String, String)>>> = None;
        let Some(s) = self.servers.get_mut(si) else { return };
        let w = &mut s.work;
        match (purpose, doc) {
            (Purpose::ApiRoot, Doc::Aggregated(items, etag)) => w.core = PartWork::Docs(items, etag),
            // No core group (an aggregated API server).
            (Purpose::ApiRoot, Doc::Absent) => w.core = PartWork::Docs(Rc::new(Vec::new()), None),
            (Purpose::ApiRoot, Doc::Unchanged) => w.core = PartWork::Unchanged,
            (Purpose::ApisRoot, Doc::Unchanged) => w.groups = PartWork::Unchanged,
            (Purpose::ApiRoot, Doc::ApiVersions(versions)) => {
                for (i, v) in versions.iter().enumerate() {
                    follow.push((format!("/api/{v}"), Purpose::CoreVersion(i)));
                }
                w.core = PartWork::Legacy(
                    versions
                        .into_iter()
                        .map(|v| (String::new(), v, Walked::Failed))
                        .collect(),
                );
            }
            (Purpose::ApisRoot, Doc::Aggregated(items, etag)) => w.groups = PartWork::Docs(items, etag),
            (Purpose::ApisRoot, Doc::GroupList(groups)) => {
                let mut walk = Vec::new();
                for (g, vs) in groups {
                    for v in vs {
                        follow.push((format!("/apis/{g}/{v}"), Purpose::GroupVersion(walk.len())));
                        walk.push((g.clone(), v, Walked::Failed));
                    }
                }
                w.groups = PartWork::Legacy(walk);
                if !w.index_asked {
                    w.index_asked = true;
                    follow.push(("/openapi/v3".to_string(), Purpose::OpenApiIndex));
                }
            }
            (Purpose::OpenApiIndex, Doc::OpenApiIndex(gvs)) => index = Some(Some(gvs)),
            (Purpose::CoreVersion(i), doc @ (Doc::ResourceList(_) | Doc::Absent)) => {
                if let PartWork::Legacy(walk) = &mut w.core {
                    if let Some((_, _, slot)) = walk.get_mut(i) {
                        *slot = walked(doc);
                    }
                }
            }
            (Purpose::GroupVersion(i), doc @ (Doc::ResourceList(_) | Doc::Absent)) => {
                if let PartWork::Legacy(walk) = &mut w.groups {
                    if let Some((_, _, slot)) = walk.get_mut(i) {
                        *slot = walked(doc);
                    }
                }
            }
            (purpose, _) => {
                // E.g. an aggregated list where a resource list belongs: unusable, count it.
                match purpose {
                    Purpose::ApiRoot => w.core = PartWork::Failed,
                    Purpose::ApisRoot => w.groups = PartWork::Failed,
                    Purpose::OpenApiIndex => index = Some(None),
                    _ => {}
                }
                step.errors.push(SyncError {
                    server: s.reference.name.clone(),
                    kind: SyncErrorKind::Decode,
                    detail: format!("unexpected document type for {purpose:?}"),
                });
            }
        }
        for (path, purpose) in follow {
            step.fetches.push(self.fetch(si, path, purpose));
        }
        match index {
            Some(gvs) => self.index_in(si, gvs, step),
            // A walk that starts after the index answered follows it too.
            None => self.follow_index(si, step),
        }
    }

    /// The OpenAPI index answered: `Some` a good one (kept as the last good), `None` a failure (the
    /// last good one, if any, is followed). Walks the group versions it adds.
    pub(super) fn index_in(&mut self, si: usize, gvs: Option<Vec<(String, String)>>, step: &mut Step) {
        let Some(s) = self.servers.get_mut(si) else { return };
        if let Some(gvs) = gvs {
            s.openapi = gvs;
        }
        s.work.index_in = true;
        self.follow_index(si, step);
    }

    /// Adds to this round's legacy walks the group versions of the server's OpenAPI index they
    /// lack (once the index is in; again when a walk starts later).
    fn follow_index(&mut self, si: usize, step: &mut Step) {
        let Some(s) = self.servers.get_mut(si) else { return };
        if !s.work.index_in {
            return;
        }
        let mut follow = Vec::new();
        for (g, v) in &s.openapi {
            let part = if g.is_empty() {
                &mut s.work.core
            } else {
                &mut s.work.groups
            };
            let PartWork::Legacy(walk) = part else { continue };
            if walk.iter().any(|(wg, wv, _)| wg == g && wv == v) {
                continue;
            }
            follow.push(if g.is_empty() {
                (format!("/api/{v}"), Purpose::CoreVersion(walk.len()))
            } else {
                (format!("/apis/{g}/{v}"), Purpose::GroupVersion(walk.len()))
            });
            walk.push((g.clone(), v.clone(), Walked::Failed));
        }
        for (path, purpose) in follow {
            step.fetches.push(self.fetch(si, path, purpose));
        }
    }
}

fn walked(doc: Doc) -> Walked {
    match doc {
        Doc::ResourceList(v) => Walked::Served(v),
        _ => Walked::NotServed,
    }
}

/// Ends a server's part of a round. Returns whether what the snapshot is built from changed.
pub(super) fn finish_server(s: &mut Server, now_ms: u64, shared: &[Rc<Vec<GroupDiscovery>>]) -> bool {
    // An equal document another server already holds is shared instead of kept twice.
    let share = |docs: Rc<Vec<GroupDiscovery>>| -> Rc<Vec<GroupDiscovery>> {
        shared.iter().find(|d| **d == docs).cloned().unwrap_or(docs)
    };
    let w = std::mem::take(&mut s.work);
    let mut changed = s.reachable == w.unreachable;
    s.reachable = !w.unreachable;
    for (part, work) in [(&mut s.core, w.core), (&mut s.groups, w.groups)] {
        match work {
            PartWork::Failed => {}
            PartWork::Unchanged => {
                if part.docs.is_some() {
                    part.last_ms = Some(now_ms);
                } else {
                    // A 304 for a document we do not hold: forget the ETags so the next round
                    // fetches everything again.
                    s.cache.clear();
                }
            }
            PartWork::Docs(docs, etag) => {
                changed |= part.docs.as_ref() != Some(&docs) || !part.unknown.is_empty();
                part.docs = Some(share(docs));
                part.etag = etag;
                part.unknown.clear();
                part.last_ms = Some(now_ms);
            }
            PartWork::Legacy(walk) => {
                let (docs, unknown) = assemble_legacy(walk, part.docs.as_deref().map(Vec::as_slice));
                // A fresh document may still say what we had (legacy servers have no ETags).
                changed |= part.docs.as_deref() != Some(&docs) || part.unknown != unknown;
                part.docs = Some(share(Rc::new(docs)));
                part.etag = None;
                part.unknown = unknown;
                part.last_ms = Some(now_ms);
            }
        }
    }
    changed
}

/// Groups from a legacy walk. A group/version whose resource list failed keeps its previously
/// learned resources, or is listed as unknown if it has none; one that answered 404 is not served
/// there. A group's versions the OpenAPI index added join its other versions.
fn assemble_legacy(
    walk: Vec<(String, String, Walked)>,
    old: Option<&[GroupDiscovery]>,
) -> (Vec<GroupDiscovery>, Vec<(String, String)>) {
    let mut groups: Vec<GroupDiscovery> = Vec::new();
    let mut unknown = Vec::new();
    for (g, v, slot) in walk {
        let version = match slot {
            Walked::Served(version) => Some(version),
            Walked::NotServed => continue,
            Walked::Failed => old.and_then(|old| {
                old.iter()
                    .find(|og| og.metadata.name == g)?
                    .versions
                    .iter()
                    .find(|ov| ov.version == v)
                    .cloned()
            }),
        };
        let Some(version) = version else {
            unknown.push((g, v));
            continue;
        };
        match groups.iter_mut().rev().find(|og| og.metadata.name == g) {
            Some(group) => group.versions.make_mut().push(version),
            None => groups.push(GroupDiscovery {
                metadata: GroupMeta { name: g.into() },
                versions: vec![version].into(),
            }),
        }
    }
    (groups, unknown)
}
