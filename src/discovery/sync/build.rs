//! The build: the snapshot of every member (table and merged documents, [`Snapshot::build`]),
//! made only when what it depends on changed and published only when it differs from the last one.

use super::{Publish, Server, Syncer};
use crate::snapshot::{Member, MergedSource, Snapshot};

/// What the built snapshot depends on besides the documents: per member its name, whether each
/// part is known and fresh, and whether it is reachable.
pub(super) type BuildInputs = (bool, Vec<(String, bool, bool, bool, bool, bool)>);

impl Syncer {
    /// Whether requests may go to `s`: it answered its last round, and the local server also its
    /// last readiness probe ([`super::local_ready`]).
    fn routable(&self, s: &Server) -> bool {
        s.reachable && (!s.reference.local || self.local_ready.ready)
    }

    /// Builds the snapshot of every member; returns it only when it differs from the last one.
    pub(super) fn build(&mut self, now_ms: u64) -> Option<Publish> {
        let staleness = self.staleness_ms;
        let members: Vec<&Server> = ordered(&self.servers);
        let membership_unknown = self.leases.is_some() && !self.leases_listed;
        let inputs: BuildInputs = (
            membership_unknown,
            members
                .iter()
                .map(|s| {
                    (
                        s.reference.name.clone(),
                        s.core.docs.is_some(),
                        s.groups.docs.is_some(),
                        s.core.fresh(now_ms, staleness),
                        s.groups.fresh(now_ms, staleness),
                        self.routable(s),
                    )
                })
                .collect(),
        );
        if !self.dirty && self.last_built.as_ref() == Some(&inputs) {
            return None;
        }
        self.dirty = false;
        self.builds += 1;
        self.last_built = Some(inputs);
        let unknown: Vec<Vec<(String, String)>> = members
            .iter()
            .map(|s| s.core.unknown.iter().chain(&s.groups.unknown).cloned().collect())
            .collect();
        let table_members: Vec<Member> = members
            .iter()
            .zip(&unknown)
            .map(|(s, unknown)| Member {
                server: s.reference.clone(),
                core: s.core.docs.as_deref().map(Vec::as_slice),
                groups: s.groups.docs.as_deref().map(Vec::as_slice),
                unknown_versions: unknown,
                fresh_core: s.core.fresh(now_ms, staleness),
                fresh_groups: s.groups.fresh(now_ms, staleness),
                reachable: self.routable(s),
            })
            .collect();
        let merged = MergedSource {
            apis: members.iter().filter_map(|s| s.groups.docs.clone()).collect(),
            core: members.iter().filter_map(|s| s.core.docs.clone()).collect(),
        };
        let mut snapshot = Snapshot::build(&table_members, merged, membership_unknown);
        let fingerprint = snapshot.table.fingerprint();
        if self.published.as_ref() == Some(&fingerprint) {
            return None;
        }
        self.published = Some(fingerprint);
        // A new key set goes to the other entry slot, under a version no earlier set of this
        // process used (milliseconds, so a restarted service does not reuse one either).
        let keys = snapshot.table.keys_fingerprint();
        snapshot.keys_changed = self.published_keys.as_ref() != Some(&keys);
        if snapshot.keys_changed {
            self.published_keys = Some(keys);
            self.keys_version = now_ms.max(self.keys_version.saturating_add(1));
            self.keys_slot ^= 1;
        }
        self.generation += 1;
        snapshot.table.generation = self.generation;
        snapshot.table.built_ms = now_ms;
        snapshot.table.keys_slot = self.keys_slot;
        snapshot.table.keys_version = self.keys_version;
        Some(snapshot)
    }
}

/// Servers by name, the local one not privileged (upstream `peer_aggregated_handler.go` sorts by
/// server identity): the merge's precedence, so every node that sees the same documents builds the
/// same merged documents and ETags, and a stable table layout.
fn ordered(servers: &[Server]) -> Vec<&Server> {
    let mut v: Vec<&Server> = servers.iter().filter(|s| !s.leaving).collect();
    v.sort_by(|a, b| a.reference.name.cmp(&b.reference.name));
    v
}
