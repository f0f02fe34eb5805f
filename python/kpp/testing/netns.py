"""A network namespace of the test run's own, with "node" addresses that are not loopback.

kube-apiserver's lease endpoint reconciler writes each server's `--advertise-address` into the
`default/kubernetes` Endpoints and EndpointSlice, and both refuse loopback addresses (upstream
`ValidateEndpointIP`). Tests of the membership mode that reads that slice therefore run their
apiservers on addresses of a dummy interface, inside a network namespace this run creates:

    python -m kpp.testing.netns -- .venv/bin/python -m pytest tests/versions

runs the command in a new network namespace (`unshare --net`, as root) whose `lo` is up and also holds
NODE_ADDRESSES (198.18.0.11-19, RFC 2544's benchmarking range, also in the test serving certificate's
SANs; `lo`, because this machine's kernel has no dummy interfaces). Packets to them never leave the namespace, and nothing inside it
reaches any other network.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

from kpp.testing.proc import die_with_parent

NODE_ADDRESSES = [f"198.18.0.{i}" for i in range(11, 20)]


def inside() -> bool:
    """Whether this process runs in such a namespace (every node address is bindable)."""
    for addr in NODE_ADDRESSES:
        s = socket.socket()
        try:
            s.bind((addr, 0))
        except OSError:
            return False
        finally:
            s.close()
    return True


def require():
    if not inside():
        raise RuntimeError(f"{NODE_ADDRESSES[0]}.. are not local addresses here: run the tests through "
                           "`python -m kpp.testing.netns -- <command>` (the Makefile's targets do)")


def _setup_script() -> str:
    lines = ["set -e", "ip link set lo up"]
    lines += [f"ip addr add {a}/32 dev lo" for a in NODE_ADDRESSES]
    lines.append('exec "$@"')
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if inside():
        os.execvp(argv[0], argv)
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            print(f"kpp.testing.netns: `{tool}` is missing (util-linux, iproute2)", file=sys.stderr)
            return 2
    # The command dies with this process (PDEATHSIG survives unshare's and bash's exec): a killed
    # `make` target or CI step never leaves the tests running, and their own processes die with them.
    return subprocess.call(["unshare", "--net", "--", "bash", "-c", _setup_script(), "kpp-netns", *argv],
                           preexec_fn=die_with_parent(signal.SIGKILL))


if __name__ == "__main__":
    sys.exit(main())
