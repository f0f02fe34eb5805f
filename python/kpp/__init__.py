"""kube-peer-proxy's Python tooling, shared by the tests, the demo, the benchmarks, the release and
the real-control-plane scripts.

* harness: launches Envoy (func-e) with the built filter; topology: the demo topology of the tests
* render: the Envoy bootstrap renderer (`python -m kpp.render --help`)
* fake_apiserver: fake kube-apiservers with one shared store (`python -m kpp.fake_apiserver`)
* cluster, envoyfront, kubeadm_node, upgrade_k8s: real etcd / kube-apiserver / kubeadm control planes
* image_volume: the image-volume static pod of the release (scripts/dist.sh)
* sim: the rolling-upgrade simulation (`python -m kpp.sim.upgrade_sim`, `make upgrade-sim`)

scripts/setup.sh puts this package's parent directory (python/) on the venv's path with a .pth file,
so `.venv/bin/python` imports `kpp` from any working directory.
"""
