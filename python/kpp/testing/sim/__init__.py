"""Rolling-upgrade simulation: three fake apiservers, an Envoy in front of each (with or without the
filter), a front load balancer, a load generator, and the classification of every response.

Entry point: `.venv/bin/python -m kpp.testing.sim.upgrade_sim --duration 90 --mode both` (`make upgrade-sim`); see README.md.
"""
