"""`xce examples copy DIR`: the shipped examples (xce_lite.examples, see shipped.py) into a folder
of the user's, so that the README's tour runs after a plain `pip install`.

Safe to repeat: a file already there with the same bytes is left alone, one the user changed is
kept (unless `force`), what a run left (pipeline/run/, __pycache__) is never shipped nor touched.
Scripts (a file starting with `#!`) are made executable. Each file is written whole (a temporary
name, then a rename), so an interrupted copy leaves no half file.
"""

from __future__ import annotations

import os
from importlib.abc import Traversable
from pathlib import Path

from xce_lite.errors import HomeError
from xce_lite.shipped import shipped

_SKIP = {"__pycache__", "run", "__init__.py"}


def files(root: Traversable | None = None, prefix: str = "") -> list[tuple[str, bytes]]:
    """(relative path, content) of every shipped example file, sorted."""
    root = shipped("examples") if root is None else root
    found: list[tuple[str, bytes]] = []
    for item in sorted(root.iterdir(), key=lambda t: t.name):
        if item.name in _SKIP or item.name.startswith("."):
            continue
        name = f"{prefix}{item.name}"
        if item.is_dir():
            found.extend(files(item, name + "/"))
        else:
            found.append((name, item.read_bytes()))
    return found


def copy_examples(dest: Path, force: bool = False) -> tuple[list[str], list[str], list[str]]:
    """(copied, already the same, kept because the user changed them); HomeError if DEST cannot be used."""
    dest = Path(os.path.expanduser(str(dest)))
    if dest.exists() and not dest.is_dir():
        raise HomeError(f"{dest} exists and is not a directory; name a directory to copy the examples into")
    copied, same, kept = [], [], []
    for name, content in files():
        target = dest / name
        if target.is_file():
            if target.read_bytes() == content:
                same.append(name)
                continue
            if not force:
                kept.append(name)
                continue
        elif target.exists():
            raise HomeError(f"{target} is in the way (not a file); move it, then copy again")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.partial")
        tmp.write_bytes(content)
        os.chmod(tmp, 0o755 if content.startswith(b"#!") else 0o644)
        os.replace(tmp, target)
        copied.append(name)
    return copied, same, kept
