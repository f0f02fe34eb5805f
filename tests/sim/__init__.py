"""Rolling-upgrade simulation: three fake apiservers, an Envoy in front of each (with or without the
filter), a front load balancer, a load generator, and the classification of every response.

Entry point: `python tests/sim/upgrade_sim.py --duration 90 --mode both` (`make upgrade-sim`).
"""
