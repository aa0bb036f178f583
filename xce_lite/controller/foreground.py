"""Running the controller in the foreground: `xce controller start` runs this in its daemon process
(cli/setup.py). Holds the home's lock for the controller's whole life; SIGTERM and SIGINT stop it.
"""

from __future__ import annotations

import os

from xce_lite.home.paths import PRIVATE_UMASK, Home


def run_foreground(home: Home) -> None:
    """Hold the home's lock and run the controller until stopped (SIGTERM or `xce controller stop`)."""
    import signal

    from xce_lite.controller.core import Controller  # the composition root: no part imports it at load
    from xce_lite.controller.daemon import hold_lock

    os.umask(PRIVATE_UMASK)  # the store, its WAL, logs, spools: this user's alone (paths.py)
    home.make_private()
    with hold_lock(home):
        controller = Controller(home)
        if controller.config.mode == "shared":
            # its users pass through (no listing) to the socket (itself 0666/0660) and, from their jobs
            # on a local host, to their own job directories in that host's spool (0711 too, runas.py)
            os.chmod(home.root, 0o711)
            os.chmod(home.spool, 0o711)
        signal.signal(signal.SIGTERM, lambda *_: controller.stop())
        signal.signal(signal.SIGINT, lambda *_: controller.stop())
        controller.serve()
