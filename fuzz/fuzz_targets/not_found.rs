//! 404 bodies come from the network: classification must never panic, text/plain must not depend
//! on the body, and a media type that needs no body must classify the same without it.
#![no_main]
use kube_peer_proxy::request::not_found::{classify, needs_body, NotFound};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let lossy = String::from_utf8_lossy(body);
    let content_type = match selector % 4 {
        0 => "application/json",
        1 => "application/vnd.kubernetes.protobuf",
        2 => "text/plain; charset=utf-8",
        // The body doubles as a Content-Type value, for the media-type parser.
        _ => lossy.as_ref(),
    };
    let got = classify(content_type, body);
    if selector % 4 == 2 {
        assert_eq!(got, NotFound::TypeNotServed);
    }
    if !needs_body(content_type) {
        assert_eq!(got, classify(content_type, b""));
    }
});
