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


def test_a_cluster_closed_on_a_failures_way_out_leaves_its_report_once_with_what_its_reporters_add():
    """A test that closes its cluster in a `finally` (started_cluster's, on test hosts) keeps its report,
    once though it kept it already (before thawing a host); an SSH host's agent log (HOME/agent-NAME.log)
    is in it, and what `reporters` add (a host's side), a reporter that fails saying so."""
    Cluster.failed.clear()
    c = Cluster()
    (c.home / "agent-host1.log").write_text("agent: lease expired: stopping 1 unit(s)\n")
    c.reporters += [lambda: "---- test host host1: its side", lambda: 1 / 0]
    with pytest.raises(AssertionError):
        try:
            try:
                raise AssertionError("the test's failure")
            except BaseException:
                c.keep_report()  # as the frozen-host tests do before they thaw sshd
                raise
        finally:
            c.close()
    [(home, text)] = Cluster.failed
    Cluster.failed.clear()
    assert home == c.home and not home.exists()
    assert "agent: lease expired: stopping 1 unit(s)" in text and "---- test host host1: its side" in text
    assert "ZeroDivisionError" in text

    quiet = Cluster()
    quiet.close()  # no failure on its way: nothing kept
    assert Cluster.failed == []
