"""xce_lite: an LSF-style batch and workflow engine.

One controller process keeps every job in one SQLite file, schedules in a process pool with a pure
scheduler core, and runs work on hosts through a small stdlib-only host agent.
"""

__version__ = "0.1.0"
