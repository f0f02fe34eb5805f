//! Client-certificate identity: Envoy's RFC 2253 subject → what kube-apiserver's x509 authenticator
//! concludes → the request headers asserting it.
#![cfg(test)]

use kube_peer_proxy::request::identity::{from_subject, peer_allowed, CertIdentity, RequestHeaderNames};

fn id(user: &str, groups: &[&str]) -> Option<CertIdentity> {
    Some(CertIdentity {
        user: user.to_string(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        uid: None,
    })
}

fn parse(subject: &str) -> Option<CertIdentity> {
    match from_subject(subject) {
        Ok(got) => got,
        Err(e) => panic!("{subject:?}: unexpected error {e}"),
    }
}

/// (user, groups), or `None` for "not authenticated".
type Expected = Option<(&'static str, &'static [&'static str])>;

/// Differential fixtures: each client certificate was made with Go's `crypto/x509` (a raw subject:
/// the printed attributes reversed, grouped as printed) and presented to Envoy 1.40.0 (BoringSSL);
/// the first column is Envoy's `%DOWNSTREAM_PEER_SUBJECT%`, the same string as the
/// `connection.subject_peer_certificate` property. The expected identity is Go 1.26's
/// `x509.ParseCertificate` of the same certificate: `Subject.CommonName` and `Subject.Organization`
/// (`None` when the CN is empty).
const ENVOY_CAPTURED: &[(&str, Expected)] = &[
    // kubeadm's certificates (`O=kubeadm:cluster-admins/CN=kubernetes-admin` is admin.conf in 1.29+).
    (
        "CN=kubernetes-admin,O=kubeadm:cluster-admins",
        Some(("kubernetes-admin", &["kubeadm:cluster-admins"])),
    ),
    (
        "CN=kubernetes-super-admin,O=system:masters",
        Some(("kubernetes-super-admin", &["system:masters"])),
    ),
    (
        "CN=system:kube-controller-manager",
        Some(("system:kube-controller-manager", &[])),
    ),
    ("CN=system:kube-scheduler", Some(("system:kube-scheduler", &[]))),
    (
        "CN=system:node:cp-1,O=system:nodes",
        Some(("system:node:cp-1", &["system:nodes"])),
    ),
    ("CN=front-proxy-client", Some(("front-proxy-client", &[]))),
    (
        "CN=kube-apiserver-kubelet-client,O=kubeadm:cluster-admins",
        Some(("kube-apiserver-kubelet-client", &["kubeadm:cluster-admins"])),
    ),
    // /O=system:masters/O=dev, team/CN=kubernetes-admin: groups come back in certificate order.
    (
        "CN=kubernetes-admin,O=dev\\, team,O=system:masters",
        Some(("kubernetes-admin", &["system:masters", "dev, team"])),
    ),
    // Every special character; '=' and a '#' that is not first stay unescaped.
    (
        "CN=x=y#z,O=a\\,b\\+c\\\"d\\\\e\\<f\\>g\\;h=i",
        Some(("x=y#z", &["a,b+c\"d\\e<f>g;h=i"])),
    ),
    // A leading '#', leading and trailing spaces.
    (
        "CN=\\ user,O=\\ both\\ ,O=\\#lead",
        Some((" user", &["#lead", " both "])),
    ),
    // UTF-8 is printed byte by byte as \XX (2-, 3- and 4-byte sequences).
    (
        "CN=J\\C3\\BCrgen,O=emoji \\F0\\9F\\98\\80,O=\\E6\\97\\A5\\E6\\9C\\AC",
        Some(("Jürgen", &["日本", "emoji 😀"])),
    ),
    // Control characters are printed as \XX (assert refuses them, see below).
    ("CN=line\\0Abreak,O=tab\\09here", Some(("line\nbreak", &["tab\there"]))),
    ("CN=del\\7F", Some(("del\u{7f}", &[]))),
    ("CN=a\\00b", Some(("a\0b", &[]))),
    ("CN=a\\C2\\85b", Some(("a\u{85}b", &[]))),
    // Multi-valued RDNs: /O=c/CN=a+O=b/ and /O=g1+O=g2+OU=unit/CN=u/ (BoringSSL reverses the flat
    // attribute list, inside an RDN too).
    ("O=b+CN=a,O=c", Some(("a", &["c", "b"]))),
    ("CN=u,OU=unit+O=g2+O=g1", Some(("u", &["g1", "g2"]))),
    // Several CNs: Go keeps the last one in certificate order, i.e. the first one printed.
    ("CN=second,O=g,CN=first", Some(("second", &["g"]))),
    ("CN=second+CN=first", Some(("second", &[]))),
    // An empty CN is "not authenticated", also when it is the last of several.
    ("CN=,O=g", None),
    ("CN=,CN=x", None),
    ("CN=x,CN=", Some(("x", &[]))),
    ("O=only", None),
    // Other attributes, including LDAP's userId ("UID", not the Kubernetes UID), are ignored.
    (
        "CN=who,DC=example,UID=ldapuid,serialNumber=42,emailAddress=a@b.c,OU=unit,O=org,L=SF,ST=CA,C=US",
        Some(("who", &["org"])),
    ),
    // An attribute BoringSSL does not know is printed as its OID and hex DER, and ignored.
    ("O=g,CN=u,1.2.3.4=#13087768617465766572", Some(("u", &["g"]))),
    // T61String (Latin-1 in both Go and BoringSSL), BMPString, IA5String, NumericString values.
    ("CN=J\\C3\\BCrgen", Some(("Jürgen", &[]))),
    ("O=gr\\C3\\BCppe,CN=\\CE\\A9mega", Some(("Ωmega", &["grüppe"]))),
    ("O=123 456,CN=ia5user", Some(("ia5user", &["123 456"]))),
    // Empty and duplicate organizations are kept, as in Go's pkix.Name.
    ("CN=u,O=g,O=", Some(("u", &["", "g"]))),
    ("CN=u,O=g,O=g", Some(("u", &["g", "g"]))),
    ("CN=u,O=\\ system:masters", Some(("u", &[" system:masters"]))),
    ("CN=end\\\\", Some(("end\\", &[]))),
    ("CN=\\#", Some(("#", &[]))),
    ("CN=\\ ", Some((" ", &[]))),
    ("CN=\\+\\,,O=\\,,O=\\+", Some(("+,", &["+", ","]))),
    // A Kubernetes UID with no CN: not authenticated before the UID is looked at.
    ("O=g,1.3.6.1.4.1.57683.2=#1309313233342D61626364", None),
];

#[test]
fn envoy_captured_subjects() {
    for (subject, want) in ENVOY_CAPTURED {
        let want = want.and_then(|(user, groups)| id(user, groups));
        assert_eq!(parse(subject), want, "{subject:?}");
    }
}

#[test]
fn kubernetes_uid_attribute_is_read_as_parse_uid_from_cert_does() {
    // x509.go parseUIDFromCert (AllowParsingUserUIDFromCertAuth, beta, on): one string value.
    let with_uid = |uid: &str| CertIdentity {
        user: "u".into(),
        groups: vec![],
        uid: Some(uid.into()),
    };
    for (subject, want) in [
        // PrintableString "1234-abcd", UTF8String "1234-abcd", IA5String "x", BMPString "ab"
        ("CN=u,1.3.6.1.4.1.57683.2=#1309313233342D61626364", "1234-abcd"),
        ("1.3.6.1.4.1.57683.2=#0C09313233342D61626364,CN=u", "1234-abcd"),
        ("CN=u+1.3.6.1.4.1.57683.2=#160178", "x"),
        ("CN=u,1.3.6.1.4.1.57683.2=#1E0400610062", "ab"),
    ] {
        assert_eq!(from_subject(subject).unwrap(), Some(with_uid(want)), "{subject}");
    }
    for (subject, why) in [
        ("CN=u,1.3.6.1.4.1.57683.2=#0C00", "empty"),
        (
            "CN=u,1.3.6.1.4.1.57683.2=#0C0161,1.3.6.1.4.1.57683.2=#0C0162",
            "two UIDs",
        ),
        ("CN=u,1.3.6.1.4.1.57683.2=#020101", "an INTEGER"),
        ("CN=u,1.3.6.1.4.1.57683.2=#0C0261", "length beyond the value"),
        ("CN=u,1.3.6.1.4.1.57683.2=#0C016162", "bytes after the value"),
        ("CN=u,1.3.6.1.4.1.57683.2=#0C81016161", "non-minimal length"),
        ("CN=u,1.3.6.1.4.1.57683.2=#0C01FF", "invalid UTF-8"),
        (r"CN=u,1.3.6.1.4.1.57683.2=#1301\2A", "not hex"),
    ] {
        assert!(from_subject(subject).is_err(), "{why}: {subject}");
    }
    // No CN: not authenticated, before the UID is looked at (CommonNameUserConversion).
    assert_eq!(from_subject("1.3.6.1.4.1.57683.2=#0C00").unwrap(), None);
}

#[test]
fn a_uid_is_asserted_only_in_a_configured_uid_header() {
    let id = CertIdentity {
        user: "u".into(),
        groups: vec!["g".into()],
        uid: Some("1234".into()),
    };
    // kubeadm configures no UID header: asserting the user without its UID would not be faithful.
    let err = RequestHeaderNames::default().assert(&id).unwrap_err();
    assert!(err.contains("UID"), "{err}");
    let with_uid = RequestHeaderNames {
        uid: vec!["X-Remote-Uid".into()],
        ..RequestHeaderNames::default()
    };
    assert_eq!(
        with_uid.assert(&id).unwrap(),
        pairs(&[
            ("x-remote-user", "u"),
            ("x-remote-uid", "1234"),
            ("x-remote-group", "g")
        ])
    );
    let bad = CertIdentity {
        uid: Some("a\nb".into()),
        ..id
    };
    assert!(with_uid.assert(&bad).is_err());
}

#[test]
fn peer_listener_accepts_exactly_the_allowed_common_names() {
    // kube-apiserver's --requestheader-allowed-names (x509.go verifySubject): the subject's CN,
    // never a SAN (SANs are not even in the subject string); an empty list allows any.
    let allowed = vec!["front-proxy-client".to_string()];
    for ok in [
        "CN=front-proxy-client",
        "CN=front-proxy-client,O=x",
        "O=y,CN=front-proxy-client",
    ] {
        assert_eq!(peer_allowed(ok, &allowed), Ok(()), "{ok}");
    }
    for refused in [
        "CN=evil-proxy",
        "",
        "O=front-proxy-client",
        r"OU=CN\=front-proxy-client,CN=evil",
        // Go's CommonName is the last CN in certificate order, i.e. the first printed
        "CN=evil,CN=front-proxy-client",
        r"CN=front-proxy-client\ ",
        "CN=Front-Proxy-Client",
        "CN=#0C1266726F6E742D70726F78792D636C69656E74",
        "CN=front-proxy-client,bad",
    ] {
        assert!(peer_allowed(refused, &allowed).is_err(), "{refused:?}");
    }
    assert_eq!(peer_allowed("CN=anything", &[]), Ok(()));
}

#[test]
fn attribute_types() {
    let cases: &[(&str, Option<CertIdentity>)] = &[
        ("cn=a,o=b", id("a", &["b"])),
        ("Cn=a,oRgAnIzAtIoNnAmE=b", id("a", &["b"])),
        ("commonName=a,organizationName=b", id("a", &["b"])),
        ("2.5.4.3=a,2.5.4.10=b", id("a", &["b"])),
        ("2.5.4.3=a+2.5.4.10=b", id("a", &["b"])),
        // Near misses are other attributes.
        ("CN=a,OU=b,2.5.4.11=c,2.5.4.100=d,2.5.4.30=e", id("a", &[])),
        ("CNN=a", None),
        ("dsa_with_SHA256=x,CN=a", id("a", &[])),
    ];
    for (subject, want) in cases {
        assert_eq!(&parse(subject), want, "{subject:?}");
    }
}

#[test]
fn escapes() {
    let cases: &[(&str, &str)] = &[
        ("CN=a\\,b", "a,b"),
        ("CN=a\\+b", "a+b"),
        ("CN=a\\\"b", "a\"b"),
        ("CN=a\\\\b", "a\\b"),
        ("CN=a\\<b\\>", "a<b>"),
        ("CN=a\\;b", "a;b"),
        ("CN=a\\=b", "a=b"),
        ("CN=a=b", "a=b"),
        ("CN=\\#a", "#a"),
        ("CN=a#", "a#"),
        ("CN=\\ a\\ ", " a "),
        ("CN=a b", "a b"),
        ("CN=\\61\\62", "ab"),
        ("CN=\\c3\\bc", "ü"),
        ("CN=\\2C", ","),
        // Raw (unescaped) UTF-8 is accepted too; RFC 4514 allows it.
        ("CN=Jürgen", "Jürgen"),
        ("CN=\\E2\\82\\AC", "€"),
    ];
    for (subject, user) in cases {
        assert_eq!(parse(subject), id(user, &[]), "{subject:?}");
    }
}

#[test]
fn empty_subject_has_no_identity() {
    assert_eq!(parse(""), None);
}

#[test]
fn malformed_subjects_are_errors() {
    let cases: &[&str] = &[
        // structure
        "CN",
        "CN=a,",
        "CN=a+",
        ",CN=a",
        "=a",
        "CN=a,,O=b",
        "CN=a,=b",
        // attribute types
        "C N=a",
        "CN =a",
        " CN=a",
        "CN=a, O=b",
        "1CN=a",
        "-CN=a",
        "2.5.4.3a=x",
        "2=a",
        "2.05.4.3=a",
        "2..4=a",
        "2.5.4.3.=a",
        "OID.2.5.4.3=a",
        "ü=a",
        // values
        "CN= a",
        "CN=a ",
        "CN=a\\",
        "CN=a\\4",
        "CN=a\\4g",
        "CN=a\\g",
        "CN=a\\U00FC",
        "CN=\"quoted\"",
        "CN=a\"b",
        "CN=a;b",
        "CN=a<b",
        "CN=a>b",
        "CN=a\0b",
        // bytes that are not UTF-8
        "CN=\\C3",
        "CN=\\C3(",
        "CN=\\FF",
        "CN=\\ED\\A0\\80",
        // '#' values: never for CN or O; malformed ones anywhere
        "CN=#0C0161",
        "2.5.4.3=#0C0161",
        "CN=a,O=#0C0161",
        "CN=a,1.2.3.4=#",
        "CN=a,1.2.3.4=#0",
        "CN=a,1.2.3.4=#0G",
        "CN=a,1.2.3.4=#0C 61",
    ];
    for subject in cases {
        let got = from_subject(subject);
        assert!(got.is_err(), "{subject:?}: expected an error, got {got:?}");
        assert!(!got.unwrap_err().is_empty());
    }
}

#[test]
fn hex_values_of_other_attributes_are_ignored() {
    assert_eq!(parse("CN=a,1.2.3.4=#0C0161+OU=#0c0162"), id("a", &[]));
}

#[test]
fn default_header_names_are_kubeadms() {
    let names = RequestHeaderNames::default();
    assert_eq!(names.username, vec!["x-remote-user"]);
    assert!(names.uid.is_empty());
    assert_eq!(names.group, vec!["x-remote-group"]);
    assert_eq!(names.extra_prefix, vec!["x-remote-extra-"]);
}

#[test]
fn identity_headers() {
    let names = RequestHeaderNames::default();
    for name in [
        "x-remote-user",
        "X-Remote-User",
        "X-REMOTE-GROUP",
        "x-remote-extra-",
        "x-remote-extra-scopes",
        "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-id",
        // Go's strings.EqualFold (the apiserver's prefix match) folds these to 'k' and 's'.
        "x-remote-extra-\u{212A}",
        "x-remote-u\u{17F}er",
    ] {
        assert!(names.is_identity_header(name), "{name:?}");
    }
    // The whole X-Remote- family, whatever the flags name (X-Remote-Uid with
    // --requestheader-uid-headers, which kubeadm does not set).
    for name in [
        "x-remote-users",
        "x-remote-uid",
        "X-Remote-Uid",
        "x-remote-groups",
        "x-remote-extra",
        "X-REMOTE-",
    ] {
        assert!(names.is_identity_header(name), "{name:?}");
    }
    for name in [
        "x-remote",
        "x-remot-user",
        "authorization",
        "x_remote_user",
        "",
        "impersonate-user",
        "x-real-ip",
    ] {
        assert!(!names.is_identity_header(name), "{name:?}");
    }
    assert!(names.is_stripped("X-Real-IP") && names.is_stripped("x-remote-uid") && !names.is_stripped("x-real"));

    let custom = RequestHeaderNames {
        username: vec!["x-user".into(), "X-Alt-User".into()],
        uid: vec![" x-uid ".into()],
        group: vec!["x-groups".into()],
        extra_prefix: vec!["x-extra-".into(), "X-Other-".into()],
    };
    for name in ["x-user", "x-alt-user", "X-UID", "x-groups", "x-extra-a", "x-other-b"] {
        assert!(custom.is_identity_header(name), "{name:?}");
    }
    for name in ["x-remote-user", "x-remote-group", "x-remote-extra-a"] {
        assert!(
            custom.is_identity_header(name),
            "the X-Remote- family, always: {name:?}"
        );
    }
    for name in ["x-extra", "x-use"] {
        assert!(!custom.is_identity_header(name), "{name:?}");
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

#[test]
fn assert_writes_user_and_one_header_per_group() {
    let names = RequestHeaderNames::default();
    let admin = id("kubernetes-admin", &["system:masters", "dev, team", "", "Jürgen"]).unwrap();
    assert_eq!(
        names.assert(&admin).unwrap(),
        pairs(&[
            ("x-remote-user", "kubernetes-admin"),
            ("x-remote-group", "system:masters"),
            ("x-remote-group", "dev, team"),
            ("x-remote-group", "Jürgen"),
        ])
    );
    assert_eq!(
        names.assert(&id("system:kube-scheduler", &[]).unwrap()).unwrap(),
        pairs(&[("x-remote-user", "system:kube-scheduler")])
    );

    // The first configured header of each kind, lower-cased.
    let custom = RequestHeaderNames {
        username: vec!["X-User".into(), "x-alt-user".into()],
        uid: Vec::new(),
        group: vec!["X-Groups".into(), "x-alt-groups".into()],
        extra_prefix: Vec::new(),
    };
    assert_eq!(
        custom.assert(&id("u", &["g"]).unwrap()).unwrap(),
        pairs(&[("x-user", "u"), ("x-groups", "g")])
    );
}

#[test]
fn assert_refuses_values_that_do_not_survive_a_header() {
    let names = RequestHeaderNames::default();
    let bad: &[(&str, &[&str])] = &[
        ("", &[]),
        ("a\r\nx-remote-group: system:masters", &[]),
        ("a\nb", &[]),
        ("a\rb", &[]),
        ("a\0b", &[]),
        ("a\tb", &[]),
        ("a\u{7f}", &[]),
        ("a\u{85}", &[]),
        (" a", &[]),
        ("a ", &[]),
        ("u", &["ok", "g\r\nx-remote-user: admin"]),
        ("u", &["g\n"]),
        ("u", &["\0"]),
        ("u", &[" system:masters"]),
        ("u", &["system:masters "]),
        ("u", &[" "]),
    ];
    for (user, groups) in bad {
        let identity = id(user, groups).unwrap();
        let got = names.assert(&identity);
        assert!(got.is_err(), "{identity:?}: expected an error, got {got:?}");
    }
}

#[test]
fn assert_needs_configured_headers() {
    let none = RequestHeaderNames {
        username: Vec::new(),
        uid: Vec::new(),
        group: Vec::new(),
        extra_prefix: Vec::new(),
    };
    assert!(none.assert(&id("u", &[]).unwrap()).is_err());

    let no_group = RequestHeaderNames {
        group: Vec::new(),
        ..RequestHeaderNames::default()
    };
    assert!(no_group.assert(&id("u", &[]).unwrap()).is_ok());
    assert!(no_group.assert(&id("u", &[""]).unwrap()).is_ok());
    assert!(no_group.assert(&id("u", &["g"]).unwrap()).is_err());

    let bad_name = RequestHeaderNames {
        username: vec!["x remote user".into()],
        ..RequestHeaderNames::default()
    };
    assert!(bad_name.assert(&id("u", &[]).unwrap()).is_err());
}

#[test]
fn subject_to_headers() {
    let names = RequestHeaderNames::default();
    let identity = parse("CN=kubernetes-admin,O=dev\\, team,O=system:masters").unwrap();
    assert_eq!(
        names.assert(&identity).unwrap(),
        pairs(&[
            ("x-remote-user", "kubernetes-admin"),
            ("x-remote-group", "system:masters"),
            ("x-remote-group", "dev, team"),
        ])
    );
    // A newline in the certificate cannot become a header.
    let identity = parse("CN=x\\0D\\0Ax-remote-group: system:masters").unwrap();
    assert!(names.assert(&identity).is_err());
}

/// The request path's matcher says what `is_stripped` says, for every name: kubeadm's names, a
/// custom set with a UID header and two extra prefixes, names in any case, near misses, names that
/// only Go's non-ASCII case folding matches (KELVIN SIGN, LONG S), and an empty prefix.
#[test]
fn stripped_names_match_is_stripped() {
    let custom = RequestHeaderNames {
        username: vec!["x-user".into(), "impersonate-me".into()],
        uid: vec!["x-uid".into()],
        group: vec!["x-groups".into()],
        extra_prefix: vec!["x-extra-".into(), "k-".into()],
    };
    let everything = RequestHeaderNames {
        extra_prefix: vec!["".into()],
        ..RequestHeaderNames::default()
    };
    let names = [
        "",
        "x",
        "x-remote-",
        "X-Remote-User",
        "x-remote-user",
        "x-remote-group",
        "X-REMOTE-EXTRA-scopes",
        "x-remote-uid",
        "x-real-ip",
        "X-Real-Ip",
        "x-real",
        "x-real-ipx",
        "x-forwarded-for",
        ":path",
        ":authority",
        "accept",
        "authorization",
        "user-agent",
        "x-user",
        "X-User",
        "x-user2",
        "impersonate-me",
        "x-uid",
        "x-groups",
        "x-extra-a",
        "x-extra",
        "k-1",
        "K-1",
        "\u{212A}-1",
        "x-remote-\u{212A}",
        "\u{017F}",
        "x-real-ip\u{017F}",
        "é",
        "x-rem\u{17F}te-user",
    ];
    for set in [RequestHeaderNames::default(), custom, everything] {
        let matcher = set.stripped_names();
        for n in names {
            assert_eq!(matcher.matches(n.as_bytes()), set.is_stripped(n), "{n:?} with {set:?}");
        }
        // Not UTF-8: judged on its lossy text, as the filter does.
        assert_eq!(matcher.matches(b"x-remote-\xff"), set.is_stripped("x-remote-\u{fffd}"));
    }
}
