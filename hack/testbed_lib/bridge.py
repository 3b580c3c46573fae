"""TCP forwarder from the caller's network namespace into the testbed's: kubectl from outside still works.

    python3 hack/testbed_lib/bridge.py --run-dir DIR --netns NAME LISTEN=TARGET [LISTEN=TARGET ...]

e.g. `127.0.0.1:46443=127.0.0.1:46443`: it binds every LISTEN address in the namespace it was started in,
then moves into the testbed namespace NAME; each accepted connection is relayed byte for byte to
TARGET there (TLS passes through untouched, so the API server's certificate for 127.0.0.1 still
matches). A listening socket stays in the namespace it was made in, so one process serves both sides.
`hack/testbed up` runs one for the API server; `hack/demo.py` one for Prometheus and Alertmanager.
--run-dir only marks the process as the testbed's (pid files trust a cmdline naming the run dir).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading

if __package__:
    from . import netns
else:  # run as a script (hack/testbed_lib/bridge.py): netns.py is next to it, on sys.path
    import netns


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)


def _relay(conn: socket.socket, target: tuple[str, int]) -> None:
    try:
        up = socket.create_connection(target, timeout=10)
    except OSError as e:
        print(f"[bridge] {target[0]}:{target[1]}: {e}", file=sys.stderr, flush=True)
        conn.close()
        return
    up.settimeout(None)
    t = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    t.start()
    _pump(conn, up)
    t.join()
    conn.close()
    up.close()


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_relay, args=(conn, target), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--netns", required=True, help="testbed namespace name (/run/netns/NAME) or a path")
    p.add_argument("forward", nargs="+", metavar="LISTEN=TARGET")
    a = p.parse_args(argv)
    pairs = []
    for spec in a.forward:
        listen, _, target = spec.partition("=")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(_addr(listen))
        s.listen(64)
        pairs.append((s, _addr(target or listen)))
    # Only now: the listeners above stay where they were bound; connections made from here on are inside.
    netns.setns_path(netns.path(a.netns) if "/" not in a.netns else a.netns)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for s, target in pairs:
        threading.Thread(target=_serve, args=(s, target), daemon=True).start()
        print(f"[bridge] {s.getsockname()[0]}:{s.getsockname()[1]} -> {target[0]}:{target[1]} in {a.netns}",
              file=sys.stderr, flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
