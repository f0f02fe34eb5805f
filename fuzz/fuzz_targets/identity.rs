//! Certificate subjects come from clients (through Envoy's printing): parsing must never panic, an
//! identity always has a user, and a successful assertion never carries a value that could break
//! out of its header or be altered by HTTP whitespace stripping.
#![no_main]
use kube_peer_proxy::request::identity::{from_subject, peer_allowed, RequestHeaderNames};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let subject = String::from_utf8_lossy(data);
    // The peer listener's check agrees with the identity: the CN it compares is the user.
    let _ = peer_allowed(&subject, &["front-proxy-client".to_string()]);
    let Ok(Some(id)) = from_subject(&subject) else {
        return;
    };
    assert!(!id.user.is_empty());
    assert_eq!(peer_allowed(&subject, &[id.user.clone()]), Ok(()));
    assert_ne!(id.uid.as_deref(), Some(""));
    let names = RequestHeaderNames::default();
    let Ok(headers) = names.assert(&id) else {
        return;
    };
    assert_eq!(headers.first(), Some(&("x-remote-user".to_string(), id.user.clone())));
    let groups: Vec<&String> = id.groups.iter().filter(|g| !g.is_empty()).collect();
    assert_eq!(headers.len(), 1 + groups.len());
    for ((name, value), group) in headers.iter().skip(1).zip(groups) {
        assert_eq!(name, "x-remote-group");
        assert_eq!(value, group);
    }
    for (name, value) in &headers {
        assert!(names.is_identity_header(name));
        assert!(!value.is_empty());
        assert!(!value.chars().any(char::is_control), "{value:?}");
        assert!(!value.starts_with(' ') && !value.ends_with(' '), "{value:?}");
    }
});
