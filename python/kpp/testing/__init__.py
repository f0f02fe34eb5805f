"""Test and simulation scaffolding: what the tests, the demo, the benchmarks and the real-control-plane
scripts run, never shipped to a node.

* harness: launches Envoy (func-e) with the built filter; topology: the demo topology of the tests
* fake_apiserver: fake kube-apiservers with one shared store (`python -m kpp.testing.fake_apiserver`)
* cluster, envoyfront, kubeadm_node, kubeadm_upgrade: real etcd / kube-apiserver / kubeadm control planes
* static_envoy, lb, lbclient, rollout: the static pod's own entrypoint behind HAProxy, under client-go-like load
* mutants: deliberately broken bootstraps, for the runs that must fail; tlsload: clients that keep going
  through certificate renewal
* sim: the simulations (`python -m kpp.testing.sim.upgrade_sim`, `python -m kpp.testing.sim.upgrade_k8s`)
"""
