"""The systemd unit that runs a home's controller at boot (`xce controller unit`).

Choices, and why:
- Type=simple: `xce controller start --foreground` serves until SIGTERM, which it handles as a planned
  stop; it sends no sd_notify, so `notify` would only time out. ExecStartPost waits until it answers
  (`xce controller status --wait`), so `systemctl start` returns when users can reach it.
- Restart=on-failure: a controller that stopped on a fault comes back (its next start reads the
  fault, and the store never lost an acknowledged job); a planned stop stays stopped.
- KillMode=process: stopping or restarting the service ends the controller only. Jobs on the local
  host run under supervisors (or in their own units) that outlive the controller, as they do when
  it is stopped by hand; control-group would kill them with it.
- After/Wants=network-online.target: the controller connects to its ssh hosts at once.
- The interpreter is the one running this command, so the unit runs the xce_lite installed here; a
  package found only through PYTHONPATH (a checkout) gets that PYTHONPATH in the unit.
- User=: the home's owner when that is not root (a personal home run at boot); a shared home is
  root's and its controller runs as root (no User= line).
Pure: builds text from values; `unit_for(home)` gathers them.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

import xce_lite
from xce_lite.home.paths import Home

UNIT_NAME = "xce-controller.service"


def unit_text(python: str, home: Path, user: str | None = None, pythonpath: str | None = None) -> str:
    """The unit file for the controller of `home`, run by `python` (absolute paths)."""
    quoted = _quote(str(home))
    lines = [
        f"# The xce_lite controller of the cluster home {home}, made by `xce controller unit`.",
        f"# Install: xce controller unit > /etc/systemd/system/{UNIT_NAME}",
        f"#          systemctl daemon-reload && systemctl enable --now {UNIT_NAME}",
        "[Unit]",
        f"Description=xce_lite controller ({home})",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={_quote(python)} -m xce_lite --home {quoted} controller start --foreground",
        # started = answering: `systemctl start` returns once the socket answers (or fails after 60 s)
        f"ExecStartPost={_quote(python)} -m xce_lite --home {quoted} controller status --wait 60",
        "Restart=on-failure",
        "RestartSec=5s",
        "KillMode=process",
        "UMask=0077",
    ]
    if pythonpath:
        lines.append(f"Environment={_quote('PYTHONPATH=' + pythonpath, command=False)}")
    if user:
        lines.append(f"User={user}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def _quote(word: str, command: bool = True) -> str:
    """A word of a unit's command line (`command`) or assignment: quoted when it holds a space, quote
    or backslash; `%` doubled, and `$` on a command line, so systemd expands neither a specifier nor
    a variable in a path."""
    word = word.replace("%", "%%")
    if command:
        word = word.replace("$", "$$")
    if any(c in word for c in " \t\"'\\"):
        return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def unit_for(home: Home) -> str:
    """The unit for `home` as this machine has it: this Python, the home's owner, a PYTHONPATH if needed."""
    import pwd

    owner = home.root.stat().st_uid
    user = None if owner == 0 else pwd.getpwuid(owner).pw_name
    package_dir = str(Path(xce_lite.__file__).resolve().parent.parent)
    installed = {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    pythonpath = None if os.path.realpath(package_dir) in installed else package_dir
    return unit_text(os.path.abspath(sys.executable), home.root, user, pythonpath)
