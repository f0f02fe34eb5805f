//! Content negotiation for `GET /apis` and `GET /api`: which document does the client want, and
//! can the filter answer it from the snapshot?
//!
//! Mirrors kube-apiserver 1.36 (`k8s.io/apiserver` v0.36.3): `discovery/aggregated/wrapper.go` asks
//! `negotiation.NegotiateMediaTypeOptions` (`endpoints/handlers/negotiation/negotiate.go`) with the
//! discovery endpoint restrictions, over `goautoneg.ParseAccept`'s clauses sorted by quality
//! (`github.com/munnerz/goautoneg`). The first clause (in that order) that a serializer (JSON, YAML,
//! protobuf) accepts with an aggregated-discovery conversion (`g=apidiscovery.k8s.io;v=v2;
//! as=APIGroupDiscoveryList`) selects aggregated discovery; otherwise the legacy handler answers in
//! the first clause it can encode without a conversion. Our deliberate differences: we produce JSON
//! only, so where upstream would answer a YAML or protobuf clause, a later clause the client also
//! accepts as JSON wins (the union in a format the client takes), and only a client that accepts no
//! JSON at all gets the local server's answer; `profile=nopeer` is the local view.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryChoice {
    /// The union of every member's aggregated discovery (v2), as JSON.
    Merged,
    /// The union as a legacy JSON document (`APIGroupList` for `/apis`).
    MergedLegacy,
    /// Pass to the local apiserver (`profile=nopeer`, YAML, protobuf, 406).
    Local,
}

/// One clause of an Accept header as goautoneg parses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Clause<'a> {
    pub kind: &'a str,
    pub sub: &'a str,
    pub q: f64,
    pub params: Vec<(&'a str, &'a str)>,
}

/// `goautoneg.ParseAccept`: clauses split on `,` and `;`, spaces trimmed (only spaces), a clause
/// without `/` skipped unless it is `*`, parameters with more than one `=` skipped, `q` parsed as a
/// float (0 when it does not parse), then sorted: higher `q` first, then concrete types before `*`.
/// Types are compared as written (no case folding), as upstream does.
pub fn parse_accept(header: &str) -> Vec<Clause<'_>> {
    let mut out: Vec<Clause> = Vec::new();
    for part in header.split(',') {
        let part = part.trim_matches(' ');
        let (media, params) = part.split_once(';').unwrap_or((part, ""));
        let (kind, sub) = match media.split_once('/') {
            None if media.trim_matches(' ') == "*" => ("*", "*"),
            None => continue,
            Some((_, sub)) if sub.contains('/') => continue,
            Some((k, s)) => (k.trim_matches(' '), s.trim_matches(' ')),
        };
        let mut clause = Clause {
            kind,
            sub,
            q: 1.0,
            params: Vec::new(),
        };
        if !params.is_empty() {
            for p in params.split(';') {
                let Some((k, v)) = p.split_once('=') else { continue };
                if v.contains('=') {
                    continue;
                }
                let token = k.trim_matches(' ');
                if token == "q" {
                    clause.q = v.parse::<f32>().map(f64::from).unwrap_or(0.0);
                } else {
                    clause.params.push((token, v.trim_matches(' ')));
                }
            }
        }
        out.push(clause);
    }
    // Go's sort.Sort on a handful of clauses is an insertion sort: mirror it exactly (goautoneg's
    // Less is not a strict weak order, so another algorithm could give another order).
    for i in 1..out.len() {
        let mut j = i;
        while j > 0 && less(out.get(j), out.get(j - 1)) {
            out.swap(j, j - 1);
            j -= 1;
        }
    }
    out
}

/// goautoneg's `acceptSlice.Less`.
fn less(a: Option<&Clause>, b: Option<&Clause>) -> bool {
    let (Some(a), Some(b)) = (a, b) else { return false };
    a.q > b.q || (a.kind != "*" && b.kind == "*") || (a.sub != "*" && b.sub == "*")
}

/// The serializers kube-apiserver offers, in its order (`runtime/serializer/codec_factory.go`):
/// (type, subtype, has a stream serializer).
const SERIALIZERS: [(&str, &str, bool); 3] = [
    ("application", "json", true),
    ("application", "yaml", false),
    ("application", "vnd.kubernetes.protobuf", true),
];

/// What `acceptMediaTypeOptions` extracts and checks from a clause's parameters.
#[derive(Default)]
struct Options<'a> {
    group: Option<&'a str>,
    version: Option<&'a str>,
    kind: Option<&'a str>,
    profile: &'a str,
}

impl Options<'_> {
    fn converts(&self) -> bool {
        self.group.is_some() || self.version.is_some() || self.kind.is_some()
    }

    /// `aggregated.IsAggregatedDiscoveryGVK` with `AggregatedDiscoveryRemoveBetaType` on (1.33+).
    fn aggregated_v2(&self) -> bool {
        self.group == Some("apidiscovery.k8s.io")
            && self.version == Some("v2")
            && self.kind == Some("APIGroupDiscoveryList")
    }
}

fn options<'a>(clause: &Clause<'a>, stream_serializer: bool) -> Option<Options<'a>> {
    let mut o = Options::default();
    for (k, v) in &clause.params {
        match *k {
            "as" => o.kind = Some(v),
            "g" => o.group = Some(v),
            "v" => o.version = Some(v),
            // Both endpoint restrictions allow only the `watch` stream schema, and only where the
            // serializer streams; neither allows a server version.
            "stream" if !v.is_empty() && (!stream_serializer || *v != "watch") => return None,
            "sv" if !v.is_empty() => return None,
            "profile" => o.profile = v,
            _ => {}
        }
    }
    Some(o)
}

fn matches(clause: &Clause, kind: &str, sub: &str) -> bool {
    (clause.kind == kind && (clause.sub == sub || clause.sub == "*")) || (clause.kind == "*" && clause.sub == "*")
}

pub fn negotiate(accept: Option<&str>) -> DiscoveryChoice {
    let Some(accept) = accept.filter(|a| !a.is_empty()) else {
        // No Accept: the first serializer (JSON), no conversion: the legacy document.
        return DiscoveryChoice::MergedLegacy;
    };
    let clauses = parse_accept(accept);
    // Aggregated discovery: the discovery restrictions accept only its conversion.
    for clause in &clauses {
        for (kind, sub, stream) in SERIALIZERS {
            if !matches(clause, kind, sub) {
                continue;
            }
            let Some(o) = options(clause, stream) else { continue };
            if !o.aggregated_v2() {
                continue;
            }
            if o.profile == "nopeer" {
                return DiscoveryChoice::Local;
            }
            if sub == "json" {
                return DiscoveryChoice::Merged;
            }
            // Deliberate difference: upstream would answer this clause (merged, as protobuf or
            // YAML); we produce JSON only, so a later JSON clause the client also accepts wins
            // (client-go's protobuf clients list one): aggregated, else legacy, else the local
            // server answers.
        }
    }
    // The legacy handler: the default restrictions accept no conversion at all.
    for clause in &clauses {
        for (kind, sub, stream) in SERIALIZERS {
            if !matches(clause, kind, sub) {
                continue;
            }
            match options(clause, stream) {
                // Upstream never merges legacy discovery; we do (for legacy clients), except when
                // the client asks for the local view.
                Some(o) if !o.converts() && o.profile == "nopeer" => return DiscoveryChoice::Local,
                Some(o) if !o.converts() && sub == "json" => return DiscoveryChoice::MergedLegacy,
                // YAML or protobuf: as above, a later JSON clause the client also accepts wins.
                _ => continue,
            }
        }
    }
    // 406 from the apiserver.
    DiscoveryChoice::Local
}
