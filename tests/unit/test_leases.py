"""The lease arithmetic (controller/leases.py, pure) and the config rule that ties it to host loss."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.configs import config_file
from xce_lite.config.cluster import load_config
from xce_lite.controller import leases
from xce_lite.exec.agent import lease as agent_lease
from xce_lite.errors import ConfigError


def test_a_grant_counts_from_the_hosts_reading_and_ends_by_when_it_was_heard_plus_the_lease():
    g = leases.grant(host_clock=1000.0, heard=50.0, seconds=180.0)
    assert (g.until, g.seconds, g.ends_by) == (1180.0, 180.0, 230.0)


@given(took=st.floats(0, 1e5), heard_late=st.floats(0, 1e3), delivered_late=st.floats(0, 1e5),
       seconds=st.floats(0.1, 1e5))
def test_however_late_a_grant_arrives_the_host_lease_ends_before_the_controller_thinks(
        took, heard_late, delivered_late, seconds):
    # One real time line: the host reads its clock (offset anywhere) at real time t0, the controller
    # hears the reading `heard_late` after, the grant reaches the host `delivered_late` after that.
    host_offset, ctl_offset, t0 = 12345.0, -999.0, took
    g = leases.grant(host_clock=t0 + host_offset, heard=t0 + heard_late + ctl_offset, seconds=seconds)
    host_deadline_real = g.until - host_offset  # the host stops its units then, wherever the grant came
    assert host_deadline_real <= g.ends_by - ctl_offset + 1e-6


def test_a_host_is_lost_only_when_every_condition_holds():
    # down at 100, controller started at 0, lost after 300, lease ends by 250, margin 60
    assert leases.lost_at(100, 0, 300, 250, 60) == 400  # host_lost_after since down rules
    assert leases.lost_at(100, 0, 300, 500, 60) == 560  # a longer lease (maintenance) rules
    assert leases.lost_at(0, 200, 300, leases.NEVER, 60) == 500  # a restart waits host_lost_after itself


def test_a_stored_lease_of_this_boot_holds_as_is_and_of_another_boot_counts_whole_from_the_start():
    stored = {"boot": "b1", "ends_by": 5000.0, "seconds": 3600.0, "granted_at": 1.0}
    assert leases.stored_ends_by(stored, "b1", started=2000.0) == 5000.0
    assert leases.stored_ends_by(stored, "b2", started=10.0) == 3610.0
    assert leases.stored_ends_by({"boot": "b2"}, "b1", started=7.0) == 7.0  # unreadable: the start's wait


def test_a_grant_is_stored_in_the_form_it_is_read_back():
    g = leases.grant(0.0, 100.0, 60.0)
    assert leases.stored_ends_by(leases.stored_record(g, "b", 1.5), "b", started=120.0) == 160.0


def test_renewals_come_four_times_per_lease_within_bounds():
    assert leases.renew_interval(180) == 45
    assert leases.renew_interval(0.4) == 0.2
    assert leases.renew_interval(3600) == 60


CONFIG = """\
cluster: t
hosts:
  - {{name: a, slots: 1, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller:
{controller}
"""


def load(tmp_path, controller: str):
    return load_config(config_file(tmp_path, CONFIG.format(controller=textwrap.indent(controller, "  "))))


def test_the_defaults_keep_host_lost_after_beyond_the_lease_and_its_margin(tmp_path):
    c = load(tmp_path, "tick: 1s").controller
    assert (c.lease, c.lease_margin, c.maintenance_lease, c.host_lost_after) == (180, 60, 3600, 300)
    c = load(tmp_path, "host_lost_after: 10s\nlease: 5s\nlease_margin: 2s\nmaintenance_lease: 1h").controller
    assert (c.lease, c.lease_margin, c.maintenance_lease) == (5, 2, 3600)


@pytest.mark.parametrize("controller", ["host_lost_after: 3s", "host_lost_after: 4m\nlease: 3m",
                                        "host_lost_after: 10s\nlease: 5s\nlease_margin: 5s"])
def test_host_lost_after_within_the_lease_and_margin_is_refused_naming_both(tmp_path, controller):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, controller)
    text = str(err.value)
    assert "host_lost_after (" in text and "must be greater than lease (" in text and "lease_margin (" in text
    assert "xce.yaml" in text and "line" in text


@pytest.mark.parametrize(("reason", "killed", "on_host_lost", "requeued"), [
    ("lease expired: no word from the controller for 00:03:01", False, "requeue", True),
    ("lease expired: no word from the controller for 00:03:01; 1 leftover process killed", False, "requeue", True),
    ("lease expired: no word from the controller for 00:03:01", True, "requeue", False),  # kill wins
    ("lease expired: no word from the controller for 00:03:01", False, "exit", False),
    ("killed by root", False, "requeue", False),
    (None, False, "requeue", False),
])
def test_an_attempt_its_host_stopped_for_want_of_a_lease_runs_again_as_on_a_lost_host(reason, killed, on_host_lost,
                                                                                      requeued):
    assert leases.requeue_after_expiry(reason, killed, on_host_lost) is requeued


def test_the_hosts_words_for_an_expired_lease_are_the_ones_the_controller_looks_for():
    assert agent_lease.expired_reason(agent_lease.clock() - 61).startswith(leases.EXPIRED)
