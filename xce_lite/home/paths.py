"""The cluster home: one folder holds a cluster's config, job store, socket, lock and spool.

Chosen by `--home`, else `$XCE_HOME`, else `~/.xce` if it holds a cluster, else the machine's
default home (a shared lab's, registered by `xce init --shared --register` as one line in
/etc/xce_lite/home), else `~/.xce` (where `xce init` makes one). So a personal home always wins over
the machine's default, and a machine without that file behaves exactly as before. Light: the CLI's
hot path imports it.

Private by default: the home is 0700 (whatever $HOME's mode) and what the controller writes in it is
0600 (directories 0700): the store holds every job's environment, secrets included. PRIVATE_UMASK
is the controller's umask, and the agents'; only a job's own output files follow its submitter's.
A shared home (`mode: shared` in its xce.yaml) is 0711 instead: every user reaches its socket and
reads xce.yaml (0644) by name, and nothing else (store, spool, log: 0600/0700, root's).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from xce_lite.errors import HomeError

# sun_path holds 108 bytes on Linux, the terminating NUL included.
_MAX_SOCKET_PATH = 107
PRIVATE_UMASK = 0o077
SHARED_MODE = 0o711  # a shared home: others may pass through to the socket, not list or read
# Where the machine's default home is registered; XCE_DEFAULT_HOME_FILE names another file (tests,
# packagers who keep configuration elsewhere).
SYSTEM_DEFAULT = "/etc/xce_lite/home"
_SHARED_LINE = re.compile(r"""^mode:\s*['"]?shared['"]?\s*(?:#.*)?$""", re.M)


def default_file() -> Path:
    """The file that names the machine's default home (one line: its path)."""
    return Path(os.environ.get("XCE_DEFAULT_HOME_FILE") or SYSTEM_DEFAULT)


def machine_default() -> Path | None:
    """The home registered as this machine's default, or None (no file, unreadable, empty, relative)."""
    try:
        text = default_file().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    line = text.splitlines()[0].strip() if text else ""
    return Path(line) if os.path.isabs(line) else None


@dataclass(frozen=True)
class Home:
    root: Path
    # how it was chosen: "option", "env", "personal" (~/.xce) or "machine" (the registered default)
    via: str = field(default="option", compare=False)

    @property
    def config(self) -> Path:
        return self.root / "xce.yaml"

    @property
    def store(self) -> Path:
        return self.root / "xce.db"

    @property
    def socket(self) -> Path:
        return self.root / "xce.sock"

    @property
    def lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def log(self) -> Path:
        return self.root / "controller.log"

    @property
    def known_hosts(self) -> Path:
        """Host keys this cluster trusts besides the user's own (`xce hosts add --accept-new`, `xce lab`)."""
        return self.root / "known_hosts"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def presets(self) -> Path:
        """Admin presets, shared read-only with users at /xce/v1/presets (presets.py)."""
        return self.root / "config" / "presets"

    @property
    def shared(self) -> bool:
        """Its xce.yaml says `mode: shared` (read with a regex: no YAML on this path)."""
        try:
            return bool(_SHARED_LINE.search(self.config.read_text(encoding="utf-8", errors="replace")))
        except OSError:
            return False

    def make_private(self, shared: bool | None = None) -> None:
        """Make the home (and its parents, as mkdir -p would, with the caller's umask) and close it
        to other users: 0700, also when an older xce_lite or the user made it 0755; its spool too
        (the agents close theirs, the store closes itself: db.py). Other users cannot reach what is
        in the home then; new files in it are 0600 besides. A shared home (`shared`, default: what
        its xce.yaml says) is 0711 instead, so that users reach its socket; its spool stays 0700."""
        shared = self.shared if shared is None else shared
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.root.mkdir(mode=0o700)
        except FileExistsError:
            pass
        for path, mode in ((self.root, SHARED_MODE if shared else 0o700), (self.spool, 0o700)):
            try:
                if path.stat().st_mode & 0o777 != mode:
                    os.chmod(path, mode)
            except FileNotFoundError:
                pass

    def personal(self) -> Home:
        """Where `xce init` and `xce quickstart` make a home when none was named: never the
        machine's default (a lab user's own cluster goes to ~/.xce)."""
        return Home(_personal_root(), "personal") if self.via == "machine" else self

    def require(self) -> Home:
        """The home, if `xce init` made it; otherwise HomeError says how to make it."""
        if not self.config.is_file():
            raise HomeError(
                f"no cluster at {self.root} (no xce.yaml there); create one with `xce init`"
                f" or `xce quickstart`, or point XCE_HOME/--home at an existing one"
            )
        if len(os.fsencode(self.socket)) > _MAX_SOCKET_PATH:
            raise HomeError(
                f"the cluster home path is too long for a Unix socket ({self.socket});"
                f" choose a home with a shorter path"
            )
        return self


def _personal_root() -> Path:
    return Path(os.path.abspath(os.path.join(os.path.expanduser("~"), ".xce")))


def resolve_home(option: str | None = None) -> Home:
    """`--home` wins over `$XCE_HOME`, which wins over `~/.xce` when it holds a cluster, which wins
    over the machine's default (default_file()); else `~/.xce`. The path is made absolute."""
    if option:
        return Home(Path(os.path.abspath(option)), "option")
    if os.environ.get("XCE_HOME"):
        return Home(Path(os.path.abspath(os.environ["XCE_HOME"])), "env")
    personal = _personal_root()
    if not (personal / "xce.yaml").exists():
        machine = machine_default()
        if machine is not None:
            return Home(Path(os.path.abspath(machine)), "machine")
    return Home(personal, "personal")
