//! The serialized header map the host hands the filter, read in place: any bytes read without a
//! panic; the pairs read, serialized again, read back the same; and the request path's matcher of stripped names agrees with `is_stripped`
//! on every name read.
#![no_main]
use kube_peer_proxy::header_map::{pairs, serialize};
use kube_peer_proxy::request::identity::RequestHeaderNames;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let read: Vec<(&[u8], &[u8])> = pairs(data).collect();
    let bytes = serialize(&read);
    let again: Vec<(&[u8], &[u8])> = pairs(&bytes).collect();
    assert_eq!(read, again);
    let names = RequestHeaderNames::default();
    let matcher = names.stripped_names();
    for (name, _) in read.iter().chain([(data, &[][..])].iter()) {
        assert_eq!(matcher.matches(name), names.is_stripped(&String::from_utf8_lossy(name)), "{name:?}");
    }
});
