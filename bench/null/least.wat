;; The least this filter's job costs on this Envoy's proxy-wasm ABI: exactly the VM entries and host
;; calls the filter makes for a locally served GET on the kubeadm profile (bench/req_probe.py lists
;; them), with no code of its own and no SDK. scripts/k8s/hop.py runs it as the `least` variant, so
;; `least - plain` is what any filter costs that must, per request, read the request's headers and
;; its client certificate, see whether a new snapshot is out, and read the answer's status for the
;; 404 guard; `filter - least` is the Rust SDK's and the filter's own code. Per request:
;;   context create;
;;   request headers: the header map (returns data: the host re-enters the VM to allocate), the
;;     client certificate's subject (`connection.subject_peer_certificate`), the CAS of the empty
;;     shared-data value `kpp.v1/publish` (`snapshot::KEY_PUBLISHED`);
;;   response headers: `:status` (returns data, so one more allocation);
;;   response body (one entry per data chunk); delete.
;; Built with binaryen's wasm-as by bench/noop/build.sh into target/bench-noop/least.wasm.
(module
  (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $value (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_property" (func $property (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_shared_data" (func $get_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $set_shared (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  ;; 16: the published key (14 bytes); 32: ":status" (7); 48: the property path (35, NUL-separated).
  (data (i32.const 16) "kpp.v1/publish")
  (data (i32.const 32) ":status")
  (data (i32.const 48) "connection\00subject_peer_certificate")
  ;; 128..148: where the host writes returned pointers, sizes and the CAS.
  (global $heap (mut i32) (i32.const 1024))
  (func (export "_initialize"))
  (func (export "proxy_abi_version_0_2_1"))
  ;; A bump allocator that starts over when the second page is full: nothing returned is kept past
  ;; the call that asked for it, and the hop's requests are sequential.
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $at i32)
    (if (i32.gt_u (i32.add (global.get $heap) (local.get $size)) (i32.const 131072))
      (then (global.set $heap (i32.const 1024))))
    (local.set $at (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $size)))
    (local.get $at))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  ;; The published key exists with an empty value, as the discovery service leaves it.
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $set_shared (i32.const 16) (i32.const 14) (i32.const 0) (i32.const 0) (i32.const 0)))
    (i32.const 1))
  (func (export "proxy_on_context_create") (param i32 i32))
  ;; 0: Continue.
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $pairs (i32.const 0) (i32.const 128) (i32.const 132)))
    (drop (call $property (i32.const 48) (i32.const 35) (i32.const 128) (i32.const 132)))
    (drop (call $get_shared (i32.const 16) (i32.const 14) (i32.const 128) (i32.const 132) (i32.const 136)))
    (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $value (i32.const 2) (i32.const 32) (i32.const 7) (i32.const 128) (i32.const 132)))
    (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_delete") (param i32))
)
