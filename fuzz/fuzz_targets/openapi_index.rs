//! The OpenAPI v3 index (`/openapi/v3`) comes from the network: its parser must reject garbage
//! without panicking, and every group version it yields must make a plain walk path.
#![no_main]
use kube_peer_proxy::discovery::openapi_index::parse_openapi_index;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(gvs) = parse_openapi_index(data) {
        for (g, v) in gvs {
            assert!(!v.is_empty() && !v.contains('/'));
            assert!(!g.contains('/') && !g.contains('?'));
        }
    }
});
