"""tests/support/localusers.shared_dir under parallel workers: the parent directory they share may be
removed by another worker's test (its last directory gone) between our mkdir of it and our mkdtemp in
it; we make it again, and the parent goes once the last directory in it does."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support import localusers


def test_a_parent_removed_by_another_worker_before_our_mkdtemp_is_made_again(tmp_path: Path, monkeypatch):
    parent = tmp_path / "xce-tests"
    monkeypatch.setattr(localusers, "SHARED_PARENT", parent)
    real = tempfile.mkdtemp
    removed = []

    def mkdtemp_after_another_worker_rmdir(*args, **kw):
        if not removed:  # the other worker's shared_dir ends just now: its rmdir of the empty parent
            parent.rmdir()
            removed.append(parent)
        return real(*args, **kw)

    monkeypatch.setattr(localusers.tempfile, "mkdtemp", mkdtemp_after_another_worker_rmdir)
    with localusers.shared_dir("t-") as path:
        assert removed and path.parent == parent and path.is_dir() and oct(path.stat().st_mode & 0o777) == "0o711"
    assert not parent.exists()
