//! Client-certificate identity, asserted to kube-apiserver as an authenticating front proxy.
//!
//! Envoy terminates client TLS and verifies any client certificate against the cluster CA; the
//! filter then tells the apiserver who the client is through the request headers of kube-apiserver's
//! `--requestheader-*` mechanism. What is asserted is exactly what kube-apiserver's own x509
//! authenticator would conclude from the same certificate:
//!
//! * `staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go`,
//!   `CommonNameUserConversion`: an empty `Subject.CommonName` is "not authenticated" (no error);
//!   otherwise user = `Subject.CommonName`, groups = `Subject.Organization` (certificate order,
//!   duplicates and empty values kept). Since 1.33 it also reads a user UID from the subject
//!   attribute `1.3.6.1.4.1.57683.2` (`parseUIDFromCert`, feature gate
//!   `AllowParsingUserUIDFromCertAuth`, beta, on; OID from `k8s.io/apimachinery/pkg/apis/asn1/oid.go`,
//!   `X509UID`) and sets the extra `authentication.kubernetes.io/credential-id` to
//!   `X509SHA256=<hex SHA-256 of the certificate DER>`.
//! * Go's `crypto/x509/pkix/pkix.go`, `Name.FillFromRDNSequence`: walks the RDNs in certificate
//!   order and the attributes of each RDN in their encoded order; every `2.5.4.3` attribute
//!   *overwrites* `CommonName` (the **last** CN in certificate order wins, an empty one included),
//!   every `2.5.4.10` attribute is appended to `Organization`. `crypto/x509/parser.go`, `parseName` /
//!   `parseASN1String`: every attribute value must be a string type (T61String read as Latin-1,
//!   PrintableString, UTF8String, BMPString, IA5String, NumericString) or the certificate does not
//!   parse at all.
//! * `staging/src/k8s.io/apiserver/pkg/authentication/request/headerrequest/requestheader.go`: the
//!   username is the first non-empty value among the configured username headers (`headerValue`),
//!   the UID likewise among the UID headers, the groups are every non-empty value of every group
//!   header (`allHeaderValues`), the extra is every header whose name starts with a configured
//!   prefix (`hasPrefixIgnoreCase`, `strings.EqualFold`), keyed by the rest of the name lower-cased
//!   and `url.PathUnescape`d (`newExtra`); all of these headers are then removed from the request
//!   (`ClearAuthenticationHeaders`).
//!
//! # The subject string
//!
//! The filter reads `connection.subject_peer_certificate`, which Envoy produces with
//! `X509_NAME_print_ex(…, XN_FLAG_RFC2253)` (`source/common/tls/utility.cc`,
//! `getRFC2253NameFromCertificate`). BoringSSL (`crypto/x509/name_print.cc`, `do_name_ex`, and
//! `crypto/asn1/a_strex.cc`, `do_esc_char`) then:
//!
//! * prints the attributes **reversed as one flat list** (`XN_FLAG_DN_REV` walks the entries from the
//!   last to the first, also inside a multi-valued RDN), joined with `,` between RDNs and `+` inside
//!   one; so the certificate order is simply the printed attribute order reversed;
//! * names an attribute by its short name (`CN`, `O`, `OU`, `emailAddress`, `UID`, …) or, when
//!   BoringSSL does not know the OID, by its dotted OID, and then prints the value as `#` and the hex
//!   of its DER (`XN_FLAG_DUMP_UNKNOWN_FIELDS`); a known attribute whose value is not a string type
//!   is dumped the same way;
//! * converts string values to UTF-8 and escapes `,` `+` `"` `\` `<` `>` `;`, a leading `#` or space
//!   and a trailing space with a backslash, and every byte above 0x7F or below 0x20 (and 0x7F) as
//!   `\XX` (so `Jürgen` is printed `J\C3\BCrgen`); no quoted values, no `\=`.
//!
//! [`from_subject`] parses the RFC 4514 grammar that covers this output and fails closed (`Err`) on
//! anything else:
//!
//! * escapes: `\` followed by one of `, + " \ < > ; = # space`, or by two hex digits (one byte; the
//!   bytes of a value must form UTF-8); anything else after `\`, or nothing, is an error;
//! * unescaped `"` `;` `<` `>` and NUL are errors, and so are an unescaped leading or trailing space
//!   in a value: RFC 4514 requires them escaped and Envoy escapes them, so a space next to `=`, `,`
//!   or `+` (`CN = a`, `CN=a, O=b`) is rejected rather than guessed at; `=` inside a value is data;
//! * attribute types: an RFC 4514 `keystring` (plus `_`, which some BoringSSL short names such as
//!   `dsa_with_SHA256` contain) compared case-insensitively, or a `numericoid` without leading zeros;
//!   CN is `CN`, `commonName` or `2.5.4.3`, O is `O`, `organizationName` or `2.5.4.10`; an empty or
//!   otherwise malformed type is an error;
//! * `#` hex values: an error for CN and O (Go accepts only string values, so the two cannot be
//!   reconciled), syntax-checked and ignored for any other attribute: BoringSSL prints every attribute
//!   with an OID it does not know that way, and such an attribute changes nothing in the identity;
//! * the Kubernetes UID attribute (`1.3.6.1.4.1.57683.2`, always printed as `#…`, the hex of its
//!   DER): decoded as `parseUIDFromCert` reads it (x509.go, 1.36): the value must be a DER string
//!   (the string types above), exactly one such attribute, not empty; otherwise an error, as the
//!   apiserver refuses such a certificate. The UID is asserted in the first configured UID header
//!   (`--requestheader-uid-headers`); with none configured (kubeadm configures none) the assertion
//!   fails rather than drop the UID (see [`RequestHeaderNames::assert`]);
//! * other attributes (OU, C, L, ST, emailAddress, LDAP `UID`, …) are ignored.
//!
//! `Err` means "the identity cannot be stated faithfully": the caller must assert nothing for such a
//! certificate (and should refuse the request) rather than fall back to some other identity.
//!
//! Not reproduced: the credential-id extra (the subject does not carry the certificate digest; Envoy
//! has it as `connection.sha256_peer_certificate_digest`), and certificates Go cannot parse but
//! BoringSSL can (e.g. a UniversalString value, or a BMPString ending in U+0000, which Go strips and
//! BoringSSL prints as `\00`: the latter fails here as a control character).
//!
//! # The headers
//!
//! [`RequestHeaderNames::assert`] returns one username header and one group header per group.
//! Header values are checked so that the apiserver reads back exactly the asserted strings: no
//! control character (no CR, LF, NUL, TAB, DEL or C1 control: no header injection, and Go's HTTP
//! server would refuse them anyway), no leading or trailing space (HTTP strips optional whitespace
//! around field values, so ` system:masters` would arrive as `system:masters`). Empty groups are not
//! sent: `allHeaderValues` drops empty values, so the apiserver's result is the same. Any such
//! violation fails the whole assertion.

/// The Kubernetes user-UID attribute of a certificate subject (`k8s.io/apimachinery/pkg/apis/asn1`,
/// `X509UID`).
pub const KUBERNETES_UID_OID: &str = "1.3.6.1.4.1.57683.2";

/// What kube-apiserver's x509 authenticator would conclude from a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The subject's common name (the last CN in certificate order); never empty.
    pub user: String,
    /// The subject's organizations, in certificate order (duplicates and empty values kept, as Go's
    /// `pkix.Name.Organization`).
    pub groups: Vec<String>,
    /// The Kubernetes user UID attribute, when the certificate has one (never empty).
    pub uid: Option<String>,
}

/// Every header of the `X-Remote-` family is removed from client requests, whatever names the
/// apiservers are configured with (user, UID, groups, extra: kube-apiserver's own defaults and
/// kubeadm's all use this prefix), besides the configured names themselves.
pub const REMOTE_PREFIX: &str = "x-remote-";

/// `X-Real-Ip`: kube-apiserver reads it into the audit log's `sourceIPs` (apimachinery
/// `utilnet.SourceIPs`, after `X-Forwarded-For`), so a client's copy is removed too.
pub const REAL_IP_HEADER: &str = "x-real-ip";

/// Which attribute an RDN component is, as far as the identity is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    CommonName,
    Organization,
    KubernetesUid,
    Other,
}

/// An attribute value: a decoded string, or a `#` hex dump of its DER (the DER bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Text(String),
    Hex(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Attribute {
    kind: Kind,
    /// The attribute type as printed, for error messages.
    name: String,
    value: Value,
}

/// Parses Envoy's RFC 2253 subject (`connection.subject_peer_certificate`, attributes in reverse
/// certificate order). `Ok(None)` when the CN is empty or absent: the apiserver would not
/// authenticate such a certificate, so no identity is asserted and the request goes on as anonymous
/// or with its bearer token. `Err` on malformed input or on a subject whose identity cannot be
/// asserted faithfully (see the module documentation).
pub fn from_subject(rfc2253: &str) -> Result<Option<CertIdentity>, String> {
    let attributes = parse_attributes(rfc2253)?;
    let common_name = common_name_of(&attributes)?;
    let mut groups = Vec::new();
    let mut uids = Vec::new();
    // Envoy prints the attributes last to first: walk them in certificate order, as
    // `pkix.Name.FillFromRDNSequence` does.
    for attribute in attributes.iter().rev() {
        match (attribute.kind, &attribute.value) {
            (Kind::Organization, Value::Text(value)) => groups.push(value.clone()),
            (Kind::KubernetesUid, value) => uids.push(value),
            _ => {}
        }
    }
    if common_name.is_empty() {
        return Ok(None);
    }
    // `parseUIDFromCert` (x509.go): only after the CN check, as `CommonNameUserConversion` does.
    let uid = match uids.as_slice() {
        [] => None,
        [value] => {
            let uid = match value {
                Value::Text(text) => text.clone(),
                Value::Hex(der) => der_string(der)
                    .ok_or_else(|| format!("the user UID attribute ({KUBERNETES_UID_OID}) is not a DER string"))?,
            };
            if uid.is_empty() {
                return Err("UID cannot be an empty string".to_string());
            }
            Some(uid)
        }
        _ => return Err(format!("expected 1 UID, but found {}", uids.len())),
    };
    Ok(Some(CertIdentity {
        user: common_name.to_string(),
        groups,
        uid,
    }))
}

/// Go's `pkix.Name.CommonName` of the subject: the last CN in certificate order (the first printed);
/// empty when there is none. A CN that is not a string is an error (Go refuses the certificate).
fn common_name_of(attributes: &[Attribute]) -> Result<&str, String> {
    let mut common_name: &str = "";
    for attribute in attributes.iter().rev() {
        match (attribute.kind, &attribute.value) {
            (Kind::CommonName | Kind::Organization, Value::Hex(_)) => {
                return Err(format!(
                    "subject attribute {} has a hex-encoded (non-string) value, which kube-apiserver \
                     does not accept",
                    attribute.name
                ));
            }
            (Kind::CommonName, Value::Text(value)) => common_name = value,
            _ => {}
        }
    }
    Ok(common_name)
}

/// The peer listener's check, as kube-apiserver's `--requestheader-allowed-names`
/// (`x509.go`, `Verifier.verifySubject`): the verified certificate's subject CN must be one of the
/// allowed names; SANs are never looked at; an empty list allows every certificate of the CA.
pub fn peer_allowed(rfc2253: &str, allowed: &[String]) -> Result<(), String> {
    if allowed.is_empty() {
        return Ok(());
    }
    let attributes = parse_attributes(rfc2253)?;
    let cn = common_name_of(&attributes)?;
    if allowed.iter().any(|a| a == cn) {
        Ok(())
    } else {
        Err(format!("x509: subject with cn={cn} is not in the allowed list"))
    }
}

/// A DER string value as Go's `parseASN1String` decodes it: UTF8String, PrintableString, IA5String,
/// NumericString, T61String (as Latin-1) and BMPString; `None` for any other tag, a bad length or an
/// invalid encoding.
fn der_string(der: &[u8]) -> Option<String> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, content) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (len_bytes, content) = rest.split_at(n);
        let len = len_bytes.iter().fold(0usize, |acc, &b| acc << 8 | usize::from(b));
        // DER: the shortest length form
        if len < 0x80 || len_bytes.first() == Some(&0) {
            return None;
        }
        (len, content)
    };
    if content.len() != len {
        return None;
    }
    match tag {
        0x0c => String::from_utf8(content.to_vec()).ok(),
        0x13 => content
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b" '()+,-./:=?*&".contains(&b))
            .then(|| String::from_utf8_lossy(content).into_owned()),
        0x16 => content
            .is_ascii()
            .then(|| String::from_utf8_lossy(content).into_owned()),
        0x12 => content
            .iter()
            .all(|&b| b.is_ascii_digit() || b == b' ')
            .then(|| String::from_utf8_lossy(content).into_owned()),
        0x14 => Some(content.iter().map(|&b| char::from(b)).collect()),
        0x1e => {
            if content.len() % 2 != 0 {
                return None;
            }
            let units: Vec<u16> = content
                .chunks(2)
                .filter_map(|c| match c {
                    [high, low] => Some(u16::from(*high) << 8 | u16::from(*low)),
                    _ => None,
                })
                .collect();
            let units = units.strip_suffix(&[0]).unwrap_or(&units);
            String::from_utf16(units).ok()
        }
        _ => None,
    }
}

/// Splits an RFC 4514 string into its attributes, in printed order. The empty string is an empty
/// name.
fn parse_attributes(dn: &str) -> Result<Vec<Attribute>, String> {
    let bytes = dn.as_bytes();
    let mut attributes = Vec::new();
    if bytes.is_empty() {
        return Ok(attributes);
    }
    let mut i = 0;
    loop {
        let start = i;
        while let Some(&c) = bytes.get(i) {
            if matches!(c, b'=' | b',' | b'+') {
                break;
            }
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            return Err(if i == start {
                format!("subject: empty attribute at byte {start}")
            } else {
                format!("subject: no '=' after the attribute type at byte {start}")
            });
        }
        // `start` and `i` are at ASCII bytes or the ends, so both are char boundaries.
        let name = dn.get(start..i).unwrap_or_default();
        let kind = classify(name).map_err(|e| format!("subject: {e} at byte {start}"))?;
        i += 1;
        let value = if bytes.get(i) == Some(&b'#') {
            let start = i + 1;
            i = skip_hex_value(bytes, start).map_err(|e| format!("subject attribute {name}: {e}"))?;
            Value::Hex(
                bytes
                    .get(start..i)
                    .unwrap_or_default()
                    .chunks(2)
                    .filter_map(|pair| Some(hex_digit(*pair.first()?)? << 4 | hex_digit(*pair.get(1)?)?))
                    .collect(),
            )
        } else {
            let (text, end) = string_value(bytes, i).map_err(|e| format!("subject attribute {name}: {e}"))?;
            i = end;
            Value::Text(text)
        };
        attributes.push(Attribute {
            kind,
            name: name.to_string(),
            value,
        });
        match bytes.get(i) {
            None => return Ok(attributes),
            // `,` starts the next RDN, `+` the next attribute of this one: the identity does not
            // depend on RDN boundaries (see the module documentation).
            Some(b',' | b'+') => i += 1,
            Some(_) => return Err(format!("subject: unexpected character at byte {i}")),
        }
    }
}

/// The attribute's kind from its type: a `keystring` (case-insensitive) or a `numericoid`.
fn classify(name: &str) -> Result<Kind, String> {
    let mut chars = name.chars();
    match chars.next() {
        None => Err("empty attribute type".to_string()),
        Some(c) if c.is_ascii_alphabetic() => {
            if !chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(format!("malformed attribute type {name:?}"));
            }
            let lower = name.to_ascii_lowercase();
            Ok(match lower.as_str() {
                "cn" | "commonname" => Kind::CommonName,
                "o" | "organizationname" => Kind::Organization,
                _ => Kind::Other,
            })
        }
        Some(c) if c.is_ascii_digit() => {
            let mut arcs = 0;
            for arc in name.split('.') {
                let well_formed =
                    !arc.is_empty() && arc.bytes().all(|b| b.is_ascii_digit()) && (arc == "0" || !arc.starts_with('0'));
                if !well_formed {
                    return Err(format!("malformed attribute OID {name:?}"));
                }
                arcs += 1;
            }
            if arcs < 2 {
                return Err(format!("malformed attribute OID {name:?}"));
            }
            Ok(match name {
                "2.5.4.3" => Kind::CommonName,
                "2.5.4.10" => Kind::Organization,
                KUBERNETES_UID_OID => Kind::KubernetesUid,
                _ => Kind::Other,
            })
        }
        Some(_) => Err(format!("malformed attribute type {name:?}")),
    }
}

/// Checks a `#` hex value starting at `i` (after the `#`): a non-empty, even number of hex digits up
/// to the next separator or the end. Returns the index of that separator.
fn skip_hex_value(bytes: &[u8], mut i: usize) -> Result<usize, String> {
    let start = i;
    while let Some(c) = bytes.get(i) {
        if matches!(c, b',' | b'+') {
            break;
        }
        if !c.is_ascii_hexdigit() {
            return Err(format!("bad hex digit in '#' value at byte {i}"));
        }
        i += 1;
    }
    let digits = i - start;
    if digits == 0 || digits % 2 != 0 {
        return Err("'#' value is not an even, non-zero number of hex digits".to_string());
    }
    Ok(i)
}

/// Whether `c` may follow a backslash as itself (RFC 4514 `ESC` / `special`).
fn is_escapable(c: u8) -> bool {
    matches!(c, b'\\' | b'"' | b'+' | b',' | b';' | b'<' | b'>' | b' ' | b'#' | b'=')
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decodes a string value starting at `i`, up to the next unescaped `,` or `+` or the end. Returns
/// the value and the index of that separator.
fn string_value(bytes: &[u8], mut i: usize) -> Result<(String, usize), String> {
    let start = i;
    let mut out = Vec::new();
    let mut trailing_space = false;
    loop {
        match bytes.get(i) {
            None | Some(b',' | b'+') => break,
            Some(b'\\') => {
                trailing_space = false;
                let Some(&next) = bytes.get(i + 1) else {
                    return Err("unterminated escape at the end".to_string());
                };
                if is_escapable(next) {
                    out.push(next);
                    i += 2;
                } else if let Some(high) = hex_digit(next) {
                    let Some(low) = bytes.get(i + 2).and_then(|&c| hex_digit(c)) else {
                        return Err(format!("bad hex escape at byte {i}"));
                    };
                    out.push(high << 4 | low);
                    i += 3;
                } else {
                    return Err(format!("invalid escape at byte {i}"));
                }
            }
            Some(&c @ (b'"' | b';' | b'<' | b'>' | 0)) => {
                return Err(format!("unescaped {:?} at byte {i}", char::from(c)));
            }
            Some(b' ') if i == start => return Err("unescaped leading space".to_string()),
            Some(&c) => {
                trailing_space = c == b' ';
                out.push(c);
                i += 1;
            }
        }
    }
    if trailing_space {
        return Err("unescaped trailing space".to_string());
    }
    let text = String::from_utf8(out).map_err(|_| "value is not valid UTF-8".to_string())?;
    Ok((text, i))
}

/// The request-header names the apiserver is configured with (kube-apiserver
/// `--requestheader-username-headers`, `--requestheader-uid-headers`,
/// `--requestheader-group-headers`, `--requestheader-extra-headers-prefix`; kubeadm's defaults are
/// `X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-` and no UID header); all lower-case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaderNames {
    pub username: Vec<String>,
    pub uid: Vec<String>,
    pub group: Vec<String>,
    pub extra_prefix: Vec<String>,
}

impl Default for RequestHeaderNames {
    /// kubeadm's `--requestheader-*` flags, lower-case.
    fn default() -> Self {
        RequestHeaderNames {
            username: vec!["x-remote-user".to_string()],
            uid: Vec::new(),
            group: vec!["x-remote-group".to_string()],
            extra_prefix: vec!["x-remote-extra-".to_string()],
        }
    }
}

/// Case folding as Go's `strings.EqualFold` for anything that can equal an ASCII letter: ASCII
/// lower-casing, plus KELVIN SIGN (U+212A) ~ `k` and LATIN SMALL LETTER LONG S (U+017F) ~ `s`.
fn fold(c: char) -> char {
    match c {
        '\u{212A}' => 'k',
        '\u{017F}' => 's',
        c => c.to_ascii_lowercase(),
    }
}

fn eq_fold(a: &str, b: &str) -> bool {
    // Every request header name is checked (`is_stripped`): ASCII, the only kind Envoy lets
    // through, is compared byte by byte; folding by chars is for the rest.
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    a.chars().map(fold).eq(b.chars().map(fold))
}

fn starts_with_fold(s: &str, prefix: &str) -> bool {
    if s.is_ascii() && prefix.is_ascii() {
        return s
            .as_bytes()
            .get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()));
    }
    let mut rest = s.chars().map(fold);
    prefix.chars().map(fold).all(|p| rest.next() == Some(p))
}

/// An HTTP field-name (`token`, RFC 9110).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A user or group name that survives a header round trip unchanged.
fn check_value(what: &str, value: &str) -> Result<(), String> {
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{what} {value:?} contains the control character U+{:04X}",
            u32::from(c)
        ));
    }
    if value.starts_with(' ') || value.ends_with(' ') {
        return Err(format!(
            "{what} {value:?} has a leading or trailing space, which HTTP would strip"
        ));
    }
    Ok(())
}

/// The configured header to write to: the first one, lower-case, a valid field name.
fn first_header(names: &[String], what: &str) -> Result<String, String> {
    let Some(name) = names.first() else {
        return Err(format!("no {what} header is configured"));
    };
    let name = name.trim();
    if !is_token(name) {
        return Err(format!("the {what} header {name:?} is not a valid header name"));
    }
    Ok(name.to_ascii_lowercase())
}

impl RequestHeaderNames {
    /// Whether a (lower-case or mixed-case) header name is one a client must never send through the
    /// proxy: any configured name, or any name starting with a configured extra prefix
    /// (case-insensitive, as the apiserver compares them). Configured names are trimmed, as
    /// kube-apiserver trims them.
    pub fn is_identity_header(&self, name: &str) -> bool {
        starts_with_fold(name, REMOTE_PREFIX)
            || self
                .username
                .iter()
                .chain(&self.uid)
                .chain(&self.group)
                .any(|h| eq_fold(name, h.trim()))
            || self.extra_prefix.iter().any(|p| starts_with_fold(name, p.trim()))
    }

    /// What a client must never send through the proxy: an identity header, or `X-Real-Ip`.
    pub fn is_stripped(&self, name: &str) -> bool {
        self.is_identity_header(name) || eq_fold(name, REAL_IP_HEADER)
    }

    /// [`RequestHeaderNames::is_stripped`] prepared for the request path (see [`StrippedNames`]).
    pub fn stripped_names(&self) -> StrippedNames {
        let lower = |n: &String| n.trim().to_ascii_lowercase().into_bytes().into_boxed_slice();
        let mut exact: Vec<Box<[u8]>> = self
            .username
            .iter()
            .chain(&self.uid)
            .chain(&self.group)
            .map(lower)
            .collect();
        exact.push(REAL_IP_HEADER.as_bytes().into());
        let mut prefixes: Vec<Box<[u8]>> = self.extra_prefix.iter().map(lower).collect();
        prefixes.push(REMOTE_PREFIX.as_bytes().into());
        let mut first = [false; 256];
        let mut any = false;
        for n in exact.iter().chain(&prefixes) {
            match n.first() {
                Some(b) => {
                    if let Some(f) = first.get_mut(usize::from(*b)) {
                        *f = true;
                    }
                }
                // An empty prefix starts every name.
                None => any = true,
            }
        }
        let ascii = exact.iter().chain(&prefixes).all(|n| n.is_ascii());
        StrippedNames {
            names: self.clone(),
            exact,
            prefixes,
            first,
            any,
            ascii,
        }
    }

    /// What the filter asserts for a request's verified client certificate (`subject`: Envoy's
    /// `connection.subject_peer_certificate`; `None` or empty without one): the headers to add, none
    /// without a certificate or without a CN (kube-apiserver would not authenticate that certificate
    /// either); `Err` (a 401) when the identity cannot be asserted faithfully.
    pub fn assertion(&self, subject: Option<&str>) -> Result<Vec<(String, String)>, String> {
        let Some(subject) = subject.filter(|s| !s.is_empty()) else {
            return Ok(Vec::new());
        };
        match from_subject(subject).map_err(|e| format!("client certificate subject {subject:?}: {e}"))? {
            Some(id) => self.assert(&id),
            None => Ok(Vec::new()),
        }
    }

    /// The headers to add upstream for an identity: (first username header, user), (first UID
    /// header, UID) when the certificate carries one, and one (first group header, group) per
    /// non-empty group, in order; names lower-case. Fails (and nothing may be asserted) when the user
    /// is empty, a user, UID or group contains a control character (CR, LF, NUL, …) or a
    /// leading/trailing space, or a needed header name is not configured (a UID with no UID header)
    /// or not a valid header name.
    pub fn assert(&self, id: &CertIdentity) -> Result<Vec<(String, String)>, String> {
        if id.user.is_empty() {
            return Err("the user name is empty".to_string());
        }
        check_value("user", &id.user)?;
        let mut headers = vec![(first_header(&self.username, "username")?, id.user.clone())];
        if let Some(uid) = &id.uid {
            // Without a UID header the apiserver would see this user without its UID: refuse instead.
            check_value("UID", uid)?;
            headers.push((first_header(&self.uid, "UID")?, uid.clone()));
        }
        let groups: Vec<&String> = id.groups.iter().filter(|g| !g.is_empty()).collect();
        if groups.is_empty() {
            return Ok(headers);
        }
        let group_header = first_header(&self.group, "group")?;
        for group in groups {
            check_value("group", group)?;
            headers.push((group_header.clone(), group.clone()));
        }
        Ok(headers)
    }
}

/// Which request header names a client must not send (see [`RequestHeaderNames::is_stripped`]),
/// checked on every request header of every request: the names are lower-cased once, an ASCII
/// name is compared byte by byte, and most names are told apart by their first byte. Any other
/// name (not ASCII, where Go's case folding has non-ASCII cases) is checked as `is_stripped` does.
#[derive(Debug, Clone)]
pub struct StrippedNames {
    names: RequestHeaderNames,
    exact: Vec<Box<[u8]>>,
    prefixes: Vec<Box<[u8]>>,
    /// First bytes (lower case) of the exact names and prefixes.
    first: [bool; 256],
    /// Some prefix is empty.
    any: bool,
    /// Every configured name is ASCII (else every name takes `is_stripped`'s way).
    ascii: bool,
}

impl StrippedNames {
    /// Whether a header named `name` must be removed: what `is_stripped` says of it as text.
    pub fn matches(&self, name: &[u8]) -> bool {
        if !(self.ascii && name.is_ascii()) {
            return self.names.is_stripped(&String::from_utf8_lossy(name));
        }
        if self.any {
            return true;
        }
        let Some(head) = name.first() else {
            return self.exact.iter().any(|n| n.is_empty());
        };
        if !self
            .first
            .get(usize::from(head.to_ascii_lowercase()))
            .copied()
            .unwrap_or(false)
        {
            return false;
        }
        self.exact.iter().any(|n| n.eq_ignore_ascii_case(name))
            || self
                .prefixes
                .iter()
                .any(|p| name.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p)))
    }
}
