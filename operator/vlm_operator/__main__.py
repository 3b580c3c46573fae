"""`vlm-operator`: run the operator (kopf) and serve its /metrics.

    vlm-operator [--namespace NS ...] [--peering NAME] [--liveness URL]

Settings come from the environment (see vlm_operator.settings); flags override
the namespaces. Without --peering the operator runs standalone (one replica);
with it, kopf peering lets several replicas run with one active.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys

from . import __version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vlm-operator", description=__doc__.splitlines()[0])
    p.add_argument("--namespace", "-n", action="append", default=None, help="namespace to watch (repeatable)")
    p.add_argument("--peering", default=None, help="kopf peering name (for more than one replica)")
    p.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority; the highest active replica works, the others stand by "
        "(default with --peering: random, so equal priorities never pause every replica)",
    )
    p.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    if args.namespace:
        os.environ["VLM_NAMESPACES"] = ",".join(args.namespace)

    import kopf
    from prometheus_client import start_http_server

    from . import handlers  # registers the handlers

    settings = handlers.SETTINGS
    fmt = kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.PLAIN
    kopf.configure(verbose=False, log_format=fmt)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    start_http_server(settings.metrics_port, addr=os.environ.get("VLM_METRICS_ADDR", "0.0.0.0"))
    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else (random.randint(1, 2**31) if args.peering else 0),
        namespaces=list(settings.namespaces),
        clusterwide=not settings.namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
