"""Envoy's `sds.<secret>.key_rotation_failed`: the counter behind the KubePeerProxyKeyRotationFailed alert.

docs/deploy.md ("Certificate renewal") says it must stay 0 through every normal renewal: a rise means
Envoy refused renewed PKI files and still serves the old ones, and it fires the alert. Every renewal
test reads it through this one place, for every SDS secret of every Envoy involved.
"""
from __future__ import annotations

from kpp import render

STAT = "key_rotation_failed"


def key_rotation_failed(envoy) -> dict[str, int]:
    """{secret name: sds.<secret>.key_rotation_failed} of one Envoy (a harness.Envoy)."""
    prefix, suffix = "sds.", f".{STAT}"
    return {name[len(prefix):-len(suffix)]: value
            for name, value in envoy.stats(rf"^sds\..*\.{STAT}$").items()
            if name.startswith(prefix) and name.endswith(suffix)}


class NoKeyRotationFailures:
    """Taken before a renewal; check() after it asserts that no SDS secret of these Envoys counted a
    refused rotation. The start must be 0 for every secret of the kubeadm profile (a counter that is
    missing, e.g. renamed by a new Envoy, would make the check pass without looking)."""

    def __init__(self, envoys, secrets=tuple(render.KUBEADM_SECRETS)):
        self.envoys = list(envoys)
        self.secrets = tuple(secrets)
        self.start = {e.name: key_rotation_failed(e) for e in self.envoys}
        for name, counts in self.start.items():
            missing = [s for s in self.secrets if s not in counts]
            assert not missing, f"envoy {name}: no sds.<secret>.{STAT} for {missing} (has {sorted(counts)})"
            assert all(v == 0 for v in counts.values()), f"envoy {name}: {STAT} not 0 at the start: {counts}"

    def now(self, envoys=None) -> dict[str, dict[str, int]]:
        return {e.name: key_rotation_failed(e) for e in (self.envoys if envoys is None else envoys)}

    def check(self, what: str = "the renewal", envoys=None) -> dict[str, dict[str, int]]:
        """envoys: a subset of those given at the start (e.g. the ones still running)."""
        now = self.now(envoys)
        risen = {f"{e}: sds.{s}.{STAT}": (self.start[e].get(s, 0), v)
                 for e, counts in now.items() for s, v in counts.items() if v != self.start[e].get(s, 0)}
        assert not risen, f"Envoy refused renewed files during {what} (KeyRotationFailed would fire): {risen}"
        return now
