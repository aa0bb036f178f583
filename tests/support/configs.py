"""Cluster config files for the config tests: the text a test writes is the home's `xce.yaml`,
UTF-8 (what the loader reads), so a test states only what differs.
"""

from __future__ import annotations

from pathlib import Path


def config_file(directory: Path, text: str) -> Path:
    """`text` written as `directory/xce.yaml`; its path."""
    path = directory / "xce.yaml"
    path.write_text(text, encoding="utf-8")
    return path
