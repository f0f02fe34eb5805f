//! Content negotiation for `GET /apis` and `GET /api`: which document does the client want, and
//! can the filter answer it from the snapshot?
//!
//! Mirrors `aggregated/wrapper.go` plus the apiserver's media-type negotiation: clauses are tried
//! in order and the first one we can serve wins. An aggregated v2 JSON clause without
//! `profile=nopeer` gets the merged aggregated document; a plain JSON clause gets the merged legacy
//! `APIGroupList` (so legacy-discovery clients see peers' groups too). We cannot produce protobuf,
//! and 1.33+ apiservers no longer produce v2beta1, so such clauses are skipped in favour of a later
//! one; `profile=nopeer` in any aggregated clause is an explicit request for the local view.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryChoice {
    /// The union of all fresh servers' aggregated discovery (v2).
    Merged,
    /// The union as a legacy document (`APIGroupList` for `/apis`).
    MergedLegacy,
    /// Pass to the local apiserver (`profile=nopeer`, protobuf-only, 406 cases).
    Local,
}

pub fn negotiate(accept: Option<&str>) -> DiscoveryChoice {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        // No Accept means JSON to the apiserver: the legacy document.
        return DiscoveryChoice::MergedLegacy;
    };
    for clause in accept.split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let base = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut g, mut v, mut as_, mut nopeer, mut conversion) = ("", "", "", false, false);
        for p in parts {
            if let Some((k, val)) = p.split_once('=') {
                let val = val.trim().trim_matches('"');
                match k.trim() {
                    "g" => g = val,
                    "v" => v = val,
                    "as" => as_ = val,
                    "profile" => nopeer = val == "nopeer",
                    _ => continue,
                }
                conversion |= k.trim() != "profile";
            }
        }
        let aggregated = g == "apidiscovery.k8s.io" && as_ == "APIGroupDiscoveryList";
        let json = matches!(base.as_str(), "application/json" | "application/*" | "*/*");
        match (aggregated, json) {
            (true, _) if nopeer => return DiscoveryChoice::Local,
            (true, true) if v == "v2" && base == "application/json" => return DiscoveryChoice::Merged,
            // v2beta1, unknown versions, protobuf: not something we (or a 1.33+ server) produce.
            (true, _) => continue,
            // Conversion parameters for something other than discovery (e.g. `as=Table`).
            (false, _) if conversion => continue,
            (false, true) => return DiscoveryChoice::MergedLegacy,
            (false, false) => continue,
        }
    }
    DiscoveryChoice::Local
}
