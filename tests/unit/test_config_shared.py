"""Shared mode's keys in xce.yaml (mode, admins, socket_group, visibility, queues' users and groups),
a profile hook's `as: root`, and what the controller derives from them: the permission policy, the
socket's mode, the refusal to run a shared home's controller as anyone but root, and the launch's
user and hooks (jobunits.py)."""

from __future__ import annotations

import grp
import os
from pathlib import Path

import pytest

from tests.support.configs import config_file
from xce_lite.config.cluster import load_config
from xce_lite.config.merge import Effective, Hook, QueueLimits, merge
from xce_lite.config.profiles import load_cluster
from xce_lite.controller.jobunits import run_as, unit_hooks
from xce_lite.controller.faults import Faults
from xce_lite.controller.host_trouble import HostTrouble
from xce_lite.controller.seams import FakeClock
from xce_lite.controller.shared import Access, mode_change_problem, policy_of, shared_problem, socket_mode
from xce_lite.controller.state import ControllerState
from xce_lite.errors import ConfigError, SpecError
from xce_lite.exec.host import HostProbe
from xce_lite.models import JobSpec

BASE = """\
cluster: lab
hosts: [{name: h1, slots: 2, mem: 1G}]
"""


def test_personal_mode_is_the_default_and_unchanged(tmp_path: Path):
    config = load_config(config_file(tmp_path, BASE + "queues: [{name: normal}]\n"))
    assert (config.mode, config.admins, config.socket_group, config.visibility) == ("personal", [], None, "full")
    assert socket_mode(config) == (0o600, None)
    assert shared_problem(config, 1000) is None
    assert config.queues[0].users is None and config.queues[0].groups is None
    assert not policy_of(config, 1000).shared


def test_shared_keys_load_and_make_the_policy(tmp_path: Path):
    group = grp.getgrgid(os.getgid()).gr_name
    config = load_config(config_file(tmp_path, BASE + f"""\
mode: shared
admins: [boss, "@{group}"]
socket_group: {group}
visibility: summary
queues: [{{name: normal, users: [alice], groups: [lab]}}]
projects: [{{name: lab, admins: [carol, "@{group}"]}}]
"""))
    assert socket_mode(config) == (0o660, os.getgid())
    policy = policy_of(config, 0)
    assert policy.shared and policy.admins == {"boss"} and policy.admin_groups == {group}
    assert policy.project_admins == {"lab": {"carol", f"@{group}"}} and policy.visibility == "summary"
    assert config.queues[0].users == ["alice"] and config.queues[0].groups == ["lab"]
    assert "runs as root" in shared_problem(config, 1000) and shared_problem(config, 0) is None
    open_to_all = load_config(config_file(tmp_path, BASE + "mode: shared\nqueues: [{name: normal}]\n"))
    assert socket_mode(open_to_all) == (0o666, None)


@pytest.mark.parametrize("text, words", [
    ("mode: lab\n", ["mode", "line 3"]),
    ("admins: [boss]\n", ["admins apply to a shared home only", "mode: shared"]),
    ("mode: shared\nsocket_group: no-such-group-xce\n", ["no-such-group-xce", "is no group of this machine"]),
    ("visibility: none\n", ["visibility"]),
    ("mode: shared\nadmins: ['bad name']\n", ["admins.0"]),
])
def test_bad_shared_keys_are_refused_with_the_field_and_what_to_do(tmp_path: Path, text: str, words: list[str]):
    with pytest.raises(ConfigError) as refused:
        load_config(config_file(tmp_path, BASE + text + "queues: [{name: normal}]\n"))
    for word in words:
        assert word in str(refused.value)


def test_a_profile_hook_may_say_as_root_and_it_reaches_the_launch_but_a_jobs_own_hook_never(tmp_path: Path):
    config_file(tmp_path, BASE + "queues: [{name: normal}]\n")
    (tmp_path / "applications.yaml").write_text("""\
applications:
  clean:
    hooks:
      post_host_exec: {argv: [/usr/local/sbin/scrub], as: root}
      pre_job_exec: [/bin/true]
""")
    _config, profiles = load_cluster(tmp_path / "xce.yaml")
    assert profiles["clean"].hooks["post_host_exec"] == Hook(("/usr/local/sbin/scrub",), None, True)
    spec = JobSpec.from_wire({"argv": ["x"], "cwd": "/", "app": "clean",
                              "exdata": {"hooks": {"pre_exec": "echo mine"}}})
    eff = merge(spec, profiles["clean"], QueueLimits("normal"))
    again = Effective.from_json(eff.to_json())  # as stored at dispatch, and read back
    hooks = {(h.point, h.layer): h for h in unit_hooks(again, True)}
    assert hooks[("post_host_exec", "profile")].as_root
    assert not hooks[("pre_job_exec", "profile")].as_root and not hooks[("pre_job_exec", "job")].as_root
    (tmp_path / "applications.yaml").write_text("applications: {bad: {hooks: {pre_job_exec: {argv: [x], as: bob}}}}\n")
    with pytest.raises(ConfigError) as refused:
        load_cluster(tmp_path / "xce.yaml")
    assert "as" in str(refused.value) and "applications.yaml" in str(refused.value)


def test_a_client_cannot_say_whom_a_job_runs_as_nor_make_its_own_hook_root():
    with pytest.raises(SpecError, match="run_as is set by the controller"):
        JobSpec.from_wire({"argv": ["x"], "cwd": "/", "exdata": {"run_as": {"name": "root", "uid": 0}}})
    with pytest.raises(SpecError, match="cannot say `as`"):
        JobSpec.from_wire({"argv": ["x"], "cwd": "/", "exdata": {"hooks": {"pre_exec": {"cmd": "x", "as": "root"}}}})


def test_the_stamped_submitter_is_the_launchs_user():
    spec = JobSpec(argv=("x",), cwd="/", exdata={"run_as": {"name": "alice", "uid": 1001, "gid": 1001,
                                                            "groups": [1001, 2000]}})
    user = run_as(spec)
    assert (user.name, user.uid, user.gid, user.groups) == ("alice", 1001, 1001, (1001, 2000))
    assert run_as(JobSpec(argv=("x",), cwd="/")) is None


def _hosts_seen(config, probes) -> Faults:
    """The controller's host states as shared.py and faults.py read them, from a configuration and
    what each host's agent said of itself when it connected."""
    state = ControllerState(config, {})
    state.probes.update(probes)
    state.host_state.update({name: "ok" for name in probes})
    access = Access(state, None, lambda refs: [])
    trouble = HostTrouble(FakeClock(), print, lambda wake: None)
    return Faults(state, None, trouble, None, None, None, access, print)


def test_a_shared_cluster_gives_no_work_to_a_host_whose_agent_cannot_run_jobs_as_their_users(tmp_path: Path):
    hosts = "hosts: [{name: h1, slots: 2, mem: 1G}, {name: h2, slots: 2, mem: 1G}]\nqueues: [{name: normal}]\n"
    probes = {"h1": HostProbe("h1", 2, 1 << 30, 3, {"can_switch_user": True}),
              "h2": HostProbe("h2", 2, 1 << 30, 3, {"can_switch_user": False,
                                                    "can_switch_user_why": "the agent runs as uid 1000, not root"})}
    shared = _hosts_seen(load_config(config_file(tmp_path, f"cluster: lab\nmode: shared\n{hosts}")), probes)
    refused = shared.access.refused_hosts()
    assert list(refused) == ["h2"]
    assert "the agent runs as uid 1000, not root" in refused["h2"] and "user: root" in refused["h2"]
    assert shared.scheduler_states() == {"h1": "ok", "h2": "closed"}
    personal = _hosts_seen(load_config(config_file(tmp_path, f"cluster: lab\n{hosts}")), probes)
    assert personal.access.refused_hosts() == {} and personal.scheduler_states() == {"h1": "ok", "h2": "ok"}


def test_mode_and_socket_group_change_only_with_a_restart(tmp_path: Path):
    queues = "queues: [{name: normal}]\n"
    personal = load_config(config_file(tmp_path, BASE + queues))
    shared = load_config(config_file(tmp_path, BASE + "mode: shared\nadmins: [boss]\n" + queues))
    assert "only with a restart" in mode_change_problem(shared, personal)
    assert "only with a restart" in mode_change_problem(personal, shared)
    more_admins = load_config(config_file(tmp_path, BASE + "mode: shared\nadmins: [boss, carol]\n" + queues))
    assert mode_change_problem(shared, more_admins) is None  # admins, visibility, ACLs apply live


def test_the_api_socket_gets_the_shared_modes_permissions_and_group(tmp_path: Path):
    import socket
    import stat

    from xce_lite.api.server import ApiServer

    group = grp.getgrnam("nogroup").gr_gid if "nogroup" in {g.gr_name for g in grp.getgrall()} else os.getgid()
    for mode, gid in ((0o600, None), (0o666, None), (0o660, group)):
        path = tmp_path / f"s{mode:o}.sock"
        server = ApiServer(path, {}, lambda _message: None, mode=mode, group=gid)
        try:
            info = path.stat()
            assert stat.S_IMODE(info.st_mode) == mode and stat.S_ISSOCK(info.st_mode)
            assert info.st_gid == (os.getgid() if gid is None else gid)
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(path))
        finally:
            server.server_close()
