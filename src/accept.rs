//! Content negotiation for `GET /apis` and `GET /api`: does the client want the peer-aggregated
//! (merged) document, or should the local apiserver answer?
//!
//! Mirrors `aggregated/wrapper.go`: the first acceptable clause wins; an aggregated v2 JSON clause
//! without `profile=nopeer` gets the merged document. We cannot produce protobuf, so a protobuf
//! aggregated clause is skipped in favour of a later one (the client listed it as acceptable),
//! except with `profile=nopeer`, which is an explicit request for the local view.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryChoice {
    /// Serve the union of all fresh servers' discovery.
    Merged,
    /// Pass to the local apiserver (legacy formats, v2beta1, `profile=nopeer`, 406 cases).
    Local,
}

pub fn negotiate(accept: Option<&str>) -> DiscoveryChoice {
    let Some(accept) = accept else {
        return DiscoveryChoice::Local;
    };
    for clause in accept.split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let base = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut g, mut v, mut as_, mut nopeer) = ("", "", "", false);
        for p in parts {
            if let Some((k, val)) = p.split_once('=') {
                match k.trim() {
                    "g" => g = val.trim(),
                    "v" => v = val.trim(),
                    "as" => as_ = val.trim(),
                    "profile" => nopeer = val.trim() == "nopeer",
                    _ => {}
                }
            }
        }
        let aggregated = g == "apidiscovery.k8s.io" && as_ == "APIGroupDiscoveryList";
        match (base.as_str(), aggregated) {
            (_, true) if nopeer => return DiscoveryChoice::Local,
            ("application/json", true) if v == "v2" => return DiscoveryChoice::Merged,
            // v2beta1 is never peer-aggregated upstream; the local server answers as it can.
            ("application/json", true) if v == "v2beta1" => return DiscoveryChoice::Local,
            // Unknown aggregated versions and protobuf are not something we produce: next clause.
            (_, true) => continue,
            ("", false) => continue,
            _ => return DiscoveryChoice::Local,
        }
    }
    DiscoveryChoice::Local
}
