"""Running the dashboard: bind, say who will be able to see what, serve with uvicorn until stopped.

The socket is bound here, before uvicorn starts, so that a port in use is a clear error and
`--port 0` prints the port the kernel chose. The dashboard reads the controller as the user who
runs it; the notice printed at start says what that exposes, and to whom.
"""

from __future__ import annotations

import getpass
import ipaddress
import secrets
import socket
from collections.abc import Callable

from xce_lite import errors
from xce_lite.home.paths import Home


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def bind(address: str, port: int) -> socket.socket:
    if not address.strip():  # '' would be every address of the machine: say which on purpose
        raise errors.SpecError("--bind needs an address (127.0.0.1 for this machine only, 0.0.0.0 for every "
                               "interface)")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as err:
        sock.close()
        hint = "choose another with --port" if err.errno == 98 else "check the address given to --bind"
        raise errors.SpecError(f"cannot listen on {address}:{port}: {err.strerror}; {hint}") from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def notice(address: str, port: int, user: str, token: str | None) -> list[str]:
    """What the person starting `xce web` must know: the link, and who can see what through it."""
    host = f"[{address}]" if ":" in address else address
    link = f"http://{host}:{port}/" + (f"?token={token}" if token else "")
    shows = (f"it shows what xce shows to {user}: every job's id, name, user, queue, state, hosts and pend "
             f"reason (as `xce jobs -u all` does), the hosts, usage, {user}'s flows and the output of {user}'s jobs")
    lines = [f"xce web: serving {link}"]
    if is_loopback(address):
        who = "only this machine can connect" + (", and only with this link (it holds a token)" if token else
                                                  ": anyone logged in here can open it (--no-token)")
        lines.append(f"  {who}; {shows}.")
    else:
        who = (f"anyone who can reach {address}:{port} over the network" +
               (" and has this link (it holds a token)" if token else ", with no token (--no-token)"))
        lines.append(f"  bound to {address}, not to localhost: {who} will see what xce shows to {user}; {shows}.")
        lines.append("  Plain HTTP: pages and the token cross the network unencrypted; keep it on a network you "
                     "trust, or put a TLS proxy in front.")
    lines.append("  /metrics (Prometheus text, aggregate numbers) needs no token. Stop with Ctrl-C.")
    return lines


def serve(home: Home, address: str, port: int, use_token: bool = True, refresh: float = 3.0,
          say: Callable[[str], None] = print) -> None:
    """Serve until interrupted. The controller need not be running: pages say so until it is."""
    import uvicorn  # the web's libraries load here, never on the CLI's submit path

    from xce_lite.web.app import create_app
    from xce_lite.web.source import Source

    sock = bind(address, port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24) if use_token else None
    source = Source(home.socket)
    try:
        user = source.get("/status")["you"]
    except errors.XceError:
        user = getpass.getuser()
    for line in notice(address, port, user, token):
        say(line)
    config = uvicorn.Config(create_app(source, token, port, refresh), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])
