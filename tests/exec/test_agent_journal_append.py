"""Appends to the spool's journal from processes other than the agent (exec/agent/journal.py): they
follow a compaction (the journal renamed over) or a removal to the file the path names, telling it
by the link count of the file they hold: no stat of the path per record."""

from __future__ import annotations

import os

import pytest

from xce_lite.exec.agent import journal as journal_mod
from xce_lite.exec.agent.journal import SharedAppender, append_shared, record


@pytest.fixture
def no_stat_of(monkeypatch):
    """Fail a stat of the given path (a per-record path walk) while the test runs."""
    watched: list[str] = []
    real = os.stat

    def stat(path, *args, **kw):
        assert os.fspath(path) not in watched, f"a stat of {path}"
        return real(path, *args, **kw)

    monkeypatch.setattr(journal_mod.os, "stat", stat)
    return watched


def compact(path) -> None:
    """What the agent's compaction does to the path: a new file renamed over it."""
    new = f"{path}.new"
    with open(new, "wb") as f:
        f.write(record("journal", version=1))
    os.rename(new, path)


@pytest.mark.parametrize("kept_open", [True, False])
def test_appends_follow_a_compaction_and_a_removal_without_a_stat_per_record(tmp_path, no_stat_of, kept_open):
    path = str(tmp_path / "journal")
    with open(path, "wb") as f:
        f.write(record("journal", version=1))
    no_stat_of.append(path)
    appender = SharedAppender(path)

    def append(data: bytes, sync: bool) -> None:
        if kept_open:
            appender.append(data, sync)
        else:
            append_shared(path, data, sync)

    append(record("started", unit="a"), False)
    old = os.open(path, os.O_RDONLY)
    compact(path)
    append(record("finished", unit="a"), True)
    os.unlink(path)
    append(record("finished", unit="b"), True)
    appender.close()
    with open(path, "rb") as f:
        assert f.read() == record("finished", unit="b")  # made again, as the removed file's writers do
    assert b'"finished"' not in os.read(old, 1 << 16)  # nothing went to the file renamed away
    os.close(old)
