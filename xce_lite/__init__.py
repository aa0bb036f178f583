"""xce_lite: an LSF-style batch and workflow engine.

One controller process keeps every job in one SQLite file, schedules in a process pool with a pure
scheduler core, and runs work on hosts through a small stdlib-only host agent.

`from xce_lite import Cluster` is the Python API (xce_lite/pyapi.py), imported only when asked
for, so that `import xce_lite.cli.main` (every `xce submit`) loads nothing more.
"""

__version__ = "0.1.0"


def __getattr__(name: str):  # PEP 562: the Python API, loaded on first use
    if name == "Cluster":
        from xce_lite.pyapi import Cluster

        return Cluster
    raise AttributeError(f"module 'xce_lite' has no attribute {name!r}")
