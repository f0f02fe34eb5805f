//! Plugin configuration is operator input: any bytes must give a Config or a clear error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = kube_peer_proxy::config::Config::parse(data) {
        assert!(!e.is_empty());
    }
});
