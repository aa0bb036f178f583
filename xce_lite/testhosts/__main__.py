"""`python -m xce_lite.testhosts up|down|status`: a practice cluster on this machine."""

from __future__ import annotations

import argparse
import sys
import time

from xce_lite.testhosts.base import DEFAULT_DIR, TestHostError
from xce_lite.testhosts.cluster import up
from xce_lite.testhosts.records import down, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xce_lite.testhosts",
        description="A practice cluster on this machine: real hosts (systemd + sshd) on loopback addresses, "
                    "as root; without root, plain hosts that are sshd processes of yours (no isolation).",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start host1..hostN")
    p_up.add_argument("n", type=int)
    p_up.add_argument("dir", nargs="?", default=str(DEFAULT_DIR), help=f"outside /tmp (default {DEFAULT_DIR})")
    p_up.add_argument("--plain", action="store_true", help="hosts without systemd (PID 1 is sleep)")
    p_up.add_argument("--unprivileged", action="store_true",
                      help="plain hosts that are only sshd processes of yours (the default without root)")
    p_up.add_argument("--first-ip", default=None, help="host1's address, e.g. 127.0.0.21 (default: first free)")
    p_up.add_argument("--timeout", type=float, default=60.0)
    for name, text in (("down", "stop every host started in DIR"), ("status", "show the hosts of DIR")):
        p = sub.add_parser(name, help=text)
        p.add_argument("dir", nargs="?", default=str(DEFAULT_DIR))
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            t0 = time.monotonic()
            started = up(args.n, args.dir, plain=args.plain or args.unprivileged, first_ip=args.first_ip,
                         timeout=args.timeout, unprivileged=True if args.unprivileged else None)
            for h in started:
                print(f"{h.name} {h.where} pid={h.pid} {h.mode}")
            d = started[0].dir
            print(f"up in {time.monotonic() - t0:.2f} s. Try: ssh -F {d}/ssh_config {started[0].name} hostname")
            print(f"Stop with: python -m xce_lite.testhosts down {d}")
        elif args.cmd == "down":
            down(args.dir)
        else:
            found = status(args.dir)
            for s in found:
                print(s.line())
            if not found:
                print(f"no test hosts in {args.dir}")
    except TestHostError as e:
        print(f"testhosts: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
