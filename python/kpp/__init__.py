"""kube-peer-proxy's Python tooling: the operator's tools at the top, the test kit under kpp.testing.

* render: the Envoy bootstrap renderer (`kube-peer-proxy-render --help`; standard library only)
* image_volume: the image-volume static pod of the release (scripts/dist.sh)
* pki_reload: the static pod's pki-reload container (deploy/static-pod.yaml), run as it ships
* testing: Envoy launcher, fake apiservers, real control planes, load balancers and the simulations
  (kpp.testing.sim), used by the tests, the demo, the benchmarks and scripts/k8s

python/pyproject.toml makes this one installable package; scripts/setup.sh installs it into .venv
editable (`pip install -e python`), so `.venv/bin/python` imports `kpp` from any working directory.
"""
