//! The request classifier as it was before the allocation-free rewrite (commit dbd3399,
//! `src/request/request_info.rs`), kept only as the reference the differential tests and the
//! `request_info` fuzz target compare the shipped parser with. Not used by the product.
#![allow(dead_code)]

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
    pub verb: String,
    /// `""` for the core group.
    pub group: &'a str,
    pub version: &'a str,
    pub namespace: &'a str,
    pub resource: &'a str,
    pub name: String,
    pub subresource: &'a str,
}

/// Splits `:path` into the path and the raw query (without `?`).
pub fn split_path(full: &str) -> (&str, &str) {
    match full.split_once('?') {
        Some((p, q)) => (p, q),
        None => (full, ""),
    }
}

/// Classifies a request as kube-apiserver will see it: Go's `url.Parse` percent-decodes the path
/// (`URL.Path`, so `job%73` is `jobs` and `a%2Fb` is two segments) and refuses an invalid escape
/// with a 400 before any handler runs; the query stays raw. The request itself is forwarded with
/// its raw path unchanged. `buf` holds the decoded path when it differs from the raw one.
pub fn parse_decoded<'a>(method: &str, full_path: &'a str, buf: &'a mut String) -> RequestKind<'a> {
    let (path, query) = split_path(full_path);
    if !path.contains('%') {
        return parse(method, full_path);
    }
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
            let h = bytes.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
            if !h.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(v);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Classifies a request like kube-apiserver does, on a path that needs no decoding (see
/// [`parse_decoded`]). `method` is the HTTP method (any case).
pub fn parse<'a>(method: &str, full_path: &'a str) -> RequestKind<'a> {
    let (path, query) = split_path(full_path);
    parse_split(method, path, query)
}

fn parse_split<'a>(method: &str, path: &'a str, query: &str) -> RequestKind<'a> {
    let trimmed = path.trim_matches('/');
    let parts: Vec<&'a str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
    let mut verb = method.to_ascii_lowercase();

    let prefix = match parts.first() {
        Some(p @ (&"api" | &"apis")) => *p,
        _ => return RequestKind::NonResource(NonResource::Other),
    };
    if parts.len() < 3 {
        return RequestKind::NonResource(non_resource_discovery(prefix, &parts));
    }
    let mut rest: &[&'a str] = parts.get(1..).unwrap_or(&[]);
    let mut group = "";
    if prefix == "apis" {
        if rest.len() < 3 {
            return RequestKind::NonResource(non_resource_discovery(prefix, &parts));
        }
        group = rest.first().copied().unwrap_or("");
        rest = rest.get(1..).unwrap_or(&[]);
    }
    let version = rest.first().copied().unwrap_or("");
    rest = rest.get(1..).unwrap_or(&[]);

    match rest.first() {
        Some(&w @ ("proxy" | "watch")) => {
            if rest.len() < 2 {
                return RequestKind::Invalid;
            }
            verb = w.to_string();
            rest = rest.get(1..).unwrap_or(&[]);
        }
        _ => {
            verb = match verb.as_str() {
                "post" => "create",
                "get" | "head" => "get",
                "put" => "update",
                "patch" => "patch",
                "delete" => "delete",
                _ => "",
            }
            .to_string();
        }
    }

    let mut namespace = "";
    if rest.first() == Some(&"namespaces") {
        if let Some(ns) = rest.get(1) {
            namespace = ns;
            // `/namespaces/<ns>/<resource>...` addresses a namespaced resource unless the third
            // part is one of the namespace object's own subresources.
            if let Some(third) = rest.get(2) {
                if *third != "status" && *third != "finalize" {
                    rest = rest.get(2..).unwrap_or(&[]);
                }
            }
        }
    }

    let resource = rest.first().copied().unwrap_or("");
    let mut name = rest.get(1).map(|s| s.to_string()).unwrap_or_default();
    let subresource = if verb == "proxy" {
        ""
    } else {
        rest.get(2).copied().unwrap_or("")
    };

    if name.is_empty() && verb == "get" {
        let opts = ListOptions::from_query(query);
        verb = if opts.watch { "watch" } else { "list" }.to_string();
        if let Some(n) = opts.field_selector_name {
            if is_valid_path_segment(&n) {
                name = n;
            }
        }
    }
    if name.is_empty() && verb == "delete" {
        verb = "deletecollection".to_string();
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

fn non_resource_discovery<'a>(prefix: &str, parts: &[&'a str]) -> NonResource<'a> {
    match (prefix, parts.len()) {
        ("api", 1) => NonResource::ApiRoot,
        ("apis", 1) => NonResource::ApisRoot,
        ("api", 2) => NonResource::CoreVersion(parts.get(1).copied().unwrap_or("")),
        ("apis", 2) => NonResource::Group(parts.get(1).copied().unwrap_or("")),
        ("apis", 3) => {
            NonResource::GroupVersion(parts.get(1).copied().unwrap_or(""), parts.get(2).copied().unwrap_or(""))
        }
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
            match percent_decode(k).as_str() {
                "watch" if watch.is_none() => watch = Some(parse_watch_bool(&percent_decode(v))),
                "fieldSelector" if field_selector_name.is_none() => {
                    field_selector_name = Some(exact_name_selector(&percent_decode(v)))
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
