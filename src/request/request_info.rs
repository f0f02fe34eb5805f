//! Kubernetes request classification, mirroring apiserver's `RequestInfoFactory.NewRequestInfo`
//! (k8s.io/apiserver `pkg/endpoints/request/requestinfo.go`, prefixes `api` and `apis`, groupless `api`).
//!
//! Only the fields that routing needs are kept. The parser works on borrowed slices of the `:path`
//! header and allocates nothing unless the path or a `watch`/`fieldSelector` value has escapes: it
//! runs on every request, in a wasm VM where an allocation and a copy cost hundreds of instructions
//! (`bench/req_probe.py`). It never panics on arbitrary input.

use std::borrow::Cow;

/// What the apiserver's RequestInfo filter would conclude about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind<'a> {
    /// `/healthz`, `/version`, `/api`, `/apis/<g>/<v>`, ... (see [`NonResource`]).
    NonResource(NonResource<'a>),
    /// A request on a resource collection or object.
    Resource(ResourceRequest<'a>),
    /// Upstream answers 500 "unable to determine kind and namespace from url" (e.g. `/api/v1/watch`).
    Invalid,
}

/// The non-resource paths the proxy cares about; everything else is `Other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NonResource<'a> {
    /// `/api` (legacy core discovery root).
    ApiRoot,
    /// `/apis` (group list).
    ApisRoot,
    /// `/api/<version>` (core group version resource list).
    CoreVersion(&'a str),
    /// `/apis/<group>`.
    Group(&'a str),
    /// `/apis/<group>/<version>`.
    GroupVersion(&'a str, &'a str),
    /// Any other non-resource URL.
    Other,
}

/// A resource request's RequestInfo. Routing reads group, version, resource and subresource; verb,
/// namespace and name are computed for the upstream-parity tests (`tests/request_info*.rs`), which
/// pin the grammar down field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest<'a> {
    /// One of upstream's verbs (`get`, `list`, `watch`, `create`, …), `""` for a method it has none for.
    pub verb: &'static str,
    /// `""` for the core group.
    pub group: &'a str,
    pub version: &'a str,
    pub namespace: &'a str,
    pub resource: &'a str,
    /// A path segment, or an exact `metadata.name` field selector's value (decoded, so owned).
    pub name: Cow<'a, str>,
    pub subresource: &'a str,
}

/// Splits `:path` into the path and the raw query (without `?`).
pub fn split_path(full: &str) -> (&str, &str) {
    let bytes = full.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'?' {
            return (full.get(..i).unwrap_or(""), full.get(i + 1..).unwrap_or(""));
        }
        i += 1;
    }
    (full, "")
}

/// Classifies a request as kube-apiserver will see it: Go's `url.Parse` percent-decodes the path
/// (`URL.Path`, so `job%73` is `jobs` and `a%2Fb` is two segments) and refuses an invalid escape
/// with a 400 before any handler runs; the query stays raw. The request itself is forwarded with
/// its raw path unchanged. `buf` holds the decoded path when it differs from the raw one.
pub fn parse_decoded<'a>(method: &str, full_path: &'a str, buf: &'a mut String) -> RequestKind<'a> {
    if let Some(kind) = parse_undecoded(method, full_path) {
        return kind;
    }
    let (path, query) = split_path(full_path);
    let Some(decoded) = unescape_path(path) else {
        return RequestKind::Invalid;
    };
    buf.clear();
    buf.push_str(&decoded);
    if full_path.len() > path.len() {
        buf.push('?');
        buf.push_str(query);
    }
    let buf: &'a String = buf;
    // A decoded `?` belongs to the path: split here, not in `parse`.
    parse_split(
        method,
        buf.get(..decoded.len()).unwrap_or(""),
        query_of(buf, decoded.len()),
    )
}

fn query_of(full: &str, path_len: usize) -> &str {
    full.get(path_len..).and_then(|q| q.strip_prefix('?')).unwrap_or("")
}

/// Go's `unescape(s, encodePath)`: `%XX` becomes a byte, `+` stays, a `%` not followed by two hex
/// digits is an error. Bytes that are not UTF-8 are replaced (no resource has such a name).
pub fn unescape_path(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Classifies a request like kube-apiserver does, on a path that needs no decoding (see
/// [`parse_decoded`]). `method` is the HTTP method (any case).
pub fn parse<'a>(method: &str, full_path: &'a str) -> RequestKind<'a> {
    let (path, query) = split_path(full_path);
    parse_split(method, path, query)
}

/// [`parse_decoded`] of a path without escapes, borrowing it; `None` when the path has an escape
/// (then [`parse_decoded`] decodes it into a buffer). One pass over the path's bytes: this runs on
/// every request.
pub fn parse_undecoded<'a>(method: &str, full_path: &'a str) -> Option<RequestKind<'a>> {
    let (parts, query) = Parts::scan(full_path)?;
    Some(classify(method, &parts, query))
}

/// The path segments the grammar looks at: `/`-separated, leading and trailing `/` trimmed, inner
/// empty segments kept (upstream's `strings.Split(strings.Trim(path, "/"), "/")`). Only the first
/// [`Parts::KEPT`] are kept (no rule reads further), with the total count: no allocation.
struct Parts<'a> {
    first: [&'a str; Parts::KEPT],
    len: usize,
}

impl<'a> Parts<'a> {
    /// The deepest segment a rule reads: `apis/<g>/<v>/watch/namespaces/<ns>/<r>/<name>/<sub>`.
    const KEPT: usize = 10;

    fn of(path: &'a str) -> Parts<'a> {
        Parts::split(path)
    }

    /// [`Parts::of`] the path of a `:path` (up to its first `?`) and its query, in one pass; `None`
    /// if the path has a `%` (an escape to decode first). Empty segments between slashes are held
    /// back until a segment follows, so trailing slashes end up trimmed as [`Parts::of`] trims them.
    fn scan(full: &'a str) -> Option<(Parts<'a>, &'a str)> {
        let mut parts = Parts {
            first: [""; Parts::KEPT],
            len: 0,
        };
        let bytes = full.as_bytes();
        let mut i = 0;
        while bytes.get(i) == Some(&b'/') {
            i += 1;
        }
        let mut from = i;
        let mut empty = 0usize;
        loop {
            let b = bytes.get(i).copied();
            match b {
                Some(b'%') => return None,
                Some(b'/') | Some(b'?') | None => {
                    if i > from {
                        for _ in 0..empty {
                            parts.push("");
                        }
                        empty = 0;
                        parts.push(full.get(from..i).unwrap_or(""));
                    } else if b == Some(b'/') {
                        empty += 1;
                    }
                    if b != Some(b'/') {
                        let query = match b {
                            Some(_) => full.get(i + 1..).unwrap_or(""),
                            None => "",
                        };
                        return Some((parts, query));
                    }
                    from = i + 1;
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn split(path: &'a str) -> Parts<'a> {
        let mut parts = Parts {
            first: [""; Parts::KEPT],
            len: 0,
        };
        let bytes = path.as_bytes();
        // A plain loop over the bytes: iterator adaptors with closures are calls per byte in the
        // wasm build.
        let mut start = 0;
        while bytes.get(start) == Some(&b'/') {
            start += 1;
        }
        let mut end = bytes.len();
        while end > start && bytes.get(end - 1) == Some(&b'/') {
            end -= 1;
        }
        let mut from = start;
        let mut i = start;
        while i < end {
            if bytes.get(i) == Some(&b'/') {
                parts.push(path.get(from..i).unwrap_or(""));
                from = i + 1;
            }
            i += 1;
        }
        if end > start {
            parts.push(path.get(from..end).unwrap_or(""));
        }
        parts
    }

    fn push(&mut self, segment: &'a str) {
        if let Some(slot) = self.first.get_mut(self.len) {
            *slot = segment;
        }
        self.len += 1;
    }

    fn get(&self, i: usize) -> Option<&'a str> {
        if i < self.len {
            self.first.get(i).copied()
        } else {
            None
        }
    }
}

/// Upstream's verb for a method (`POST` creates, …), matched in any case; `""` for any other.
fn method_verb(method: &str) -> &'static str {
    const VERBS: [(&str, &str); 6] = [
        ("get", "get"),
        ("head", "get"),
        ("post", "create"),
        ("put", "update"),
        ("patch", "patch"),
        ("delete", "delete"),
    ];
    VERBS
        .iter()
        .find(|(m, _)| m.eq_ignore_ascii_case(method))
        .map_or("", |(_, v)| v)
}

fn parse_split<'a>(method: &str, path: &'a str, query: &str) -> RequestKind<'a> {
    classify(method, &Parts::of(path), query)
}

fn classify<'a>(method: &str, parts: &Parts<'a>, query: &str) -> RequestKind<'a> {
    let prefix = match parts.get(0) {
        Some(p @ ("api" | "apis")) => p,
        _ => return RequestKind::NonResource(NonResource::Other),
    };
    if parts.len < 3 {
        return RequestKind::NonResource(non_resource_discovery(prefix, parts));
    }
    // `at` is the first segment of `rest` (upstream's `currentParts`).
    let mut at = 1;
    let mut group = "";
    if prefix == "apis" {
        if parts.len < 4 {
            return RequestKind::NonResource(non_resource_discovery(prefix, parts));
        }
        group = parts.get(1).unwrap_or("");
        at = 2;
    }
    let version = parts.get(at).unwrap_or("");
    at += 1;

    let mut verb = match parts.get(at) {
        Some(w @ ("proxy" | "watch")) => {
            if parts.len < at + 2 {
                return RequestKind::Invalid;
            }
            at += 1;
            if w == "proxy" {
                "proxy"
            } else {
                "watch"
            }
        }
        _ => method_verb(method),
    };

    let mut namespace = "";
    if parts.get(at) == Some("namespaces") {
        if let Some(ns) = parts.get(at + 1) {
            namespace = ns;
            // `/namespaces/<ns>/<resource>...` addresses a namespaced resource unless the third
            // part is one of the namespace object's own subresources.
            if let Some(third) = parts.get(at + 2) {
                if third != "status" && third != "finalize" {
                    at += 2;
                }
            }
        }
    }

    let resource = parts.get(at).unwrap_or("");
    let mut name = Cow::Borrowed(parts.get(at + 1).unwrap_or(""));
    let subresource = if verb == "proxy" {
        ""
    } else {
        parts.get(at + 2).unwrap_or("")
    };

    if name.is_empty() && verb == "get" {
        let opts = ListOptions::from_query(query);
        verb = if opts.watch { "watch" } else { "list" };
        if let Some(n) = opts.field_selector_name {
            if is_valid_path_segment(&n) {
                name = Cow::Owned(n);
            }
        }
    }
    if name.is_empty() && verb == "delete" {
        verb = "deletecollection";
    }

    RequestKind::Resource(ResourceRequest {
        verb,
        group,
        version,
        namespace,
        resource,
        name,
        subresource,
    })
}

fn non_resource_discovery<'a>(prefix: &str, parts: &Parts<'a>) -> NonResource<'a> {
    match (prefix, parts.len) {
        ("api", 1) => NonResource::ApiRoot,
        ("apis", 1) => NonResource::ApisRoot,
        ("api", 2) => NonResource::CoreVersion(parts.get(1).unwrap_or("")),
        ("apis", 2) => NonResource::Group(parts.get(1).unwrap_or("")),
        ("apis", 3) => NonResource::GroupVersion(parts.get(1).unwrap_or(""), parts.get(2).unwrap_or("")),
        _ => NonResource::Other,
    }
}

/// The two list options that change RequestInfo: `watch` and an exact `metadata.name` field selector.
#[derive(Debug, Default, PartialEq, Eq)]
struct ListOptions {
    watch: bool,
    field_selector_name: Option<String>,
}

impl ListOptions {
    fn from_query(query: &str) -> Self {
        let mut watch: Option<bool> = None;
        let mut field_selector_name: Option<Option<String>> = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            // Like Go's url.Values.Get, the first occurrence of a key wins.
            match query_key(k) {
                Some(QueryKey::Watch) if watch.is_none() => watch = Some(parse_watch_bool(&query_value(v))),
                Some(QueryKey::FieldSelector) if field_selector_name.is_none() => {
                    field_selector_name = Some(exact_name_selector(&query_value(v)))
                }
                _ => {}
            }
        }
        ListOptions {
            watch: watch.unwrap_or(false),
            field_selector_name: field_selector_name.flatten(),
        }
    }
}

/// The two query keys RequestInfo reads.
enum QueryKey {
    Watch,
    FieldSelector,
}

/// Which of the two keys `raw` names once decoded; a key without an escape is compared as it is
/// (a LIST's `limit`, `labelSelector`, `resourceVersion` cost no decoding).
fn query_key(raw: &str) -> Option<QueryKey> {
    let decoded = query_value(raw);
    match decoded.as_ref() {
        "watch" => Some(QueryKey::Watch),
        "fieldSelector" => Some(QueryKey::FieldSelector),
        _ => None,
    }
}

/// A query value decoded (`%XX`, `+`), borrowed when there is nothing to decode.
fn query_value(raw: &str) -> Cow<'_, str> {
    if raw.bytes().any(|b| b == b'%' || b == b'+') {
        Cow::Owned(percent_decode(raw))
    } else {
        Cow::Borrowed(raw)
    }
}

/// Go's `runtime.Convert_Slice_string_To_bool` as used for `watch`: "0" and "false" (any case)
/// are false, anything else (including empty) is true.
fn parse_watch_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// apimachinery `fields.ParseSelector(sel)` followed by `RequiresExactMatch("metadata.name")`.
///
/// Returns `None` when no `metadata.name=x` / `metadata.name==x` term exists **or** when the selector
/// does not parse: upstream then fails the whole list-options decode and leaves `Name` empty.
/// Grammar (k8s.io/apimachinery `pkg/fields/selector.go`): terms split on unescaped `,`, sorted,
/// empty terms skipped; each term splits at the first `!=`, `==` or `=` (no trimming); the value is
/// unescaped (`\\`, `\,`, `\=`; any other escape, a trailing `\`, or an unescaped `,`/`=` is an error).
/// The first matching term **in sorted order** wins.
fn exact_name_selector(sel: &str) -> Option<String> {
    let mut terms = split_selector_terms(sel);
    terms.sort_unstable();
    let mut found: Option<String> = None;
    for term in terms.into_iter().filter(|t| !t.is_empty()) {
        let (field, op, raw_value) = split_selector_term(term)?;
        let value = unescape_selector_value(raw_value)?;
        // `field == "" && value == ""` becomes Everything() upstream; it never matches a field.
        if op != "!=" && field == "metadata.name" && found.is_none() {
            found = Some(value);
        }
    }
    found
}

/// apimachinery `fields.splitTerms`: split on `,` not preceded by a `\` escape (escapes are kept).
fn split_selector_terms(sel: &str) -> Vec<&str> {
    if sel.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in sel.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(sel.get(start..i).unwrap_or(""));
            start = i + 1;
        }
    }
    terms.push(sel.get(start..).unwrap_or(""));
    terms
}

/// apimachinery `fields.splitTerm`: the first position where `!=`, `==` or `=` starts.
fn split_selector_term(term: &str) -> Option<(&str, &'static str, &str)> {
    term.char_indices().find_map(|(i, _)| {
        let rest = term.get(i..)?;
        let op = ["!=", "==", "="].into_iter().find(|op| rest.starts_with(op))?;
        Some((term.get(..i)?, op, rest.get(op.len()..)?))
    })
}

/// apimachinery `fields.UnescapeValue`.
fn unescape_selector_value(v: &str) -> Option<String> {
    let mut out = String::with_capacity(v.len());
    let mut in_slash = false;
    for c in v.chars() {
        if in_slash {
            if !matches!(c, '\\' | ',' | '=') {
                return None;
            }
            out.push(c);
            in_slash = false;
        } else {
            match c {
                '\\' => in_slash = true,
                ',' | '=' => return None,
                _ => out.push(c),
            }
        }
    }
    (!in_slash).then_some(out)
}

/// apimachinery `path.IsValidPathSegmentName`: not `.`/`..`, no `/` or `%`.
fn is_valid_path_segment(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// Decodes `%XX` and `+` (query semantics). Invalid escapes are kept verbatim.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| {
                    let h = std::str::from_utf8(h).ok()?;
                    u8::from_str_radix(h, 16).ok()
                });
                match hex {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
