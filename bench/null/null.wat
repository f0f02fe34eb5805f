;; The least a proxy-wasm filter can be in Envoy: the ABI 0.2.1 exports proxy-wasm-cpp-host needs,
;; and per request only the two VM entries every HTTP filter gets (context create, request headers),
;; with no host call and no SDK. scripts/k8s/hop.py runs it as the `null` variant: what any
;; proxy-wasm filter costs on this Envoy build before it does anything (the wasm floor, bench/noop,
;; adds the Rust SDK's dispatch, its other exports and one header read). Built with binaryen's
;; wasm-as by bench/noop/build.sh into target/bench-noop/null.wasm.
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "_initialize"))
  (func (export "proxy_abi_version_0_2_1"))
  ;; Never called (no host call returns data), but the host looks for it.
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $at i32)
    (local.set $at (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $size)))
    (local.get $at))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_context_create") (param i32 i32))
  ;; 0: Continue.
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
)
