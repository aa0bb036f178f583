"""tests/support/cluster.py's report of a failed test (what CI keeps): a cluster that a
`running_cluster` block closes on its way out of a failure leaves its controller's and agents'
last lines and its journals' last records for the test's report (tests/conftest.py), read before
its files are removed."""

from __future__ import annotations

import json

import pytest

from tests.support.cluster import Cluster, running_cluster


def test_a_failing_block_leaves_its_report_and_a_journal_is_summed_up_record_by_record():
    Cluster.failed.clear()
    with pytest.raises(AssertionError), running_cluster(config="cluster: [not a name\n"):
        raise AssertionError("never here: the start fails")  # pragma: no cover
    [(home, text)] = Cluster.failed
    Cluster.failed.clear()
    assert not home.exists() and "is not valid YAML" in text  # closed; the controller's words kept

    c = Cluster()
    try:
        spool = c.home / "spool"
        (spool / "local").mkdir(parents=True)
        (spool / "agent-local.log").write_text("agent: staying to enforce it\n")
        lines = [{"event": "started", "unit": "u1"}, {"event": "queued", "unit": "u2", "spec": {"after": "u1"}},
                 {"event": "finished", "unit": "u1", "result": {"exit_code": 0}}]
        (spool / "local" / "journal").write_text("".join(json.dumps(r) + "\n" for r in lines) + "{torn\n")
        text = c.report()
        assert "agent: staying to enforce it" in text
        assert "started u1\nqueued u2 after u1\nfinished u1" in text
    finally:
        c.close()
