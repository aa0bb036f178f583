"""Store faults made for real, shared by the store's tests and the controller's: another process
that holds the database's write lock, and a small file system that a test can fill to the last byte.
Both undo themselves when the block ends, whatever the test did inside it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# Takes the write lock (BEGIN IMMEDIATE) of the database argv[1], says so, and keeps it until its
# stdin closes. sqlite3 from the standard library: the holder shares no code with the store.
HOLDER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test lets go
con.execute("ROLLBACK")
"""


@contextlib.contextmanager
def write_lock_held(db: Path) -> Iterator[None]:
    """Another process holds `db`'s write lock for the block (it has it when the block starts)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str, mode: str | None = None) -> Iterator[Path]:
    """A tmpfs of `size` (and `mode`, if given) mounted on `path`, made if missing, for the block."""
    path.mkdir(exist_ok=True)
    options = f"size={size}" + (f",mode={mode}" if mode else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
