"""The cluster home: one folder holds a cluster's config, job store, socket, lock and spool.

Chosen by `--home`, else `$XCE_HOME`, else `~/.xce`. Light: the CLI's hot path imports it.

Private by default: the home is 0700 (whatever $HOME's mode) and what the controller writes in it is
0600 (directories 0700): the store holds every job's environment, secrets included. PRIVATE_UMASK
is the controller's umask, and the agents'; only a job's own output files follow its submitter's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from xce_lite.errors import HomeError

# sun_path holds 108 bytes on Linux, the terminating NUL included.
_MAX_SOCKET_PATH = 107
PRIVATE_UMASK = 0o077


@dataclass(frozen=True)
class Home:
    root: Path

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

    def make_private(self) -> None:
        """Make the home (and its parents, as mkdir -p would, with the caller's umask) and close it
        to other users: 0700, also when an older xce_lite or the user made it 0755; its spool too
        (the agents close theirs, the store closes itself: db.py). Other users cannot reach what is
        in the home then; new files in it are 0600 besides."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.root.mkdir(mode=0o700)
        except FileExistsError:
            pass
        for path in (self.root, self.spool):
            try:
                if path.stat().st_mode & 0o077:
                    os.chmod(path, 0o700)
            except FileNotFoundError:
                pass

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


def resolve_home(option: str | None = None) -> Home:
    """`--home` wins over `$XCE_HOME`, which wins over `~/.xce`. The path is made absolute."""
    raw = option or os.environ.get("XCE_HOME") or os.path.join(os.path.expanduser("~"), ".xce")
    return Home(Path(os.path.abspath(raw)))
