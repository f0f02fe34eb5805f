"""Run fake apiservers until SIGINT/SIGTERM.

    .venv/bin/python -m kpp.testing.fake_apiserver --instance a:16441:old --instance b:16442:new[:legacy-only][,v2beta1]

Instance syntax: NAME:PORT:APISET[:OPTION,...] with APISET `old` or `new` (port 0 picks a free port) and
options `legacy-only` (a pre-1.26 server without aggregated discovery) and `v2beta1` (also answer v2beta1).
"""

import argparse
import signal
import threading

from kpp.testing.fake_apiserver.server import Cluster

_OPTIONS = {"legacy-only", "v2beta1"}


def _instance(spec: str) -> tuple[str, int, str, dict]:
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit() or parts[2] not in ("old", "new"):
        raise argparse.ArgumentTypeError(f"want NAME:PORT:old|new[:OPTION,...], got {spec!r}")
    options = set(parts[3].split(",")) if len(parts) == 4 else set()
    if options - _OPTIONS:
        raise argparse.ArgumentTypeError(f"unknown options {sorted(options - _OPTIONS)}; known: {sorted(_OPTIONS)}")
    return parts[0], int(parts[1]), parts[2], {"aggregated": "legacy-only" not in options,
                                               "accept_v2beta1": "v2beta1" in options}


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m kpp.testing.fake_apiserver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance", type=_instance, action="append", required=True,
                        metavar="NAME:PORT:APISET[:OPTION,...]")
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    cluster = Cluster()
    try:
        for name, port, apiset, options in args.instance:
            instance = cluster.start(name, port, apiset, **options)
            print(f"fake-apiserver {name} ({apiset}) listening on {instance.url}", flush=True)
        done.wait()
    finally:
        cluster.stop_all()


if __name__ == "__main__":
    main()
