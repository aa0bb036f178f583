"""The record of a fatal fault (fault_record.FaultRecord) in a real home: written on a fault, read
by the next start, a bug's traceback in the log, cleared by a clean stop."""

from __future__ import annotations

from xce_lite import errors
from xce_lite.controller.fault_record import FaultRecord
from xce_lite.home.paths import Home


def test_a_fault_is_recorded_read_by_the_next_start_then_cleared(tmp_path):
    home, logs = Home(tmp_path), []
    first = FaultRecord(home, logs.append)
    assert first.previous is None
    first.fatal(errors.StoreError("the job store is not a database"))
    assert "restore it from a backup" in logs[-1] and not any("Traceback" in line for line in logs)
    second = FaultRecord(home, logs.append)
    assert second.previous["why"].startswith("the job store is not a database; restore it")
    try:
        raise KeyError("lost")
    except KeyError as err:
        second.fatal(err)  # a bug: its traceback goes to the log
    assert any("Traceback" in line for line in logs)
    assert FaultRecord(home, logs.append).previous["why"] == "unexpected KeyError: 'lost'"
    second.clear()
    assert FaultRecord(home, logs.append).previous is None
