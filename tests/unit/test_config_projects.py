"""config/projects.py: projects, group defaults and fair share in xce.yaml; errors name the file, the
field, the line and the fix; the scheduler's values come out in base units."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.configs import config_file
from xce_lite.config.cluster import load_config
from xce_lite.errors import ConfigError
from xce_lite.sched.fairshare import FairShare

BASE = """\
cluster: lab
hosts:
  - {name: h1, slots: 8, mem: 8G, gpus: 2, resources: {scratch: 1T}}
resources: {scratch: {kind: size}}
shared: {lic: 4}
queues:
  - name: normal
    default: true
"""
GOOD = BASE + """\
    fairshare: {by: project, half_life: 12h, shares: {lab/vision: 3, default: 2}, gpu_weight: 4}
projects:
  - {name: lab, members: [alice], admins: [alice], limits: {slots: 8, mem: 2048, jobs: 3}}
  - name: lab/vision
    groups: [vis]
    limits: {gpus: 2, scratch: 100G, lic: 1}
groups: {vis: {default_project: lab/vision}}
default_project: lab
"""


def load(tmp_path: Path, text: str):
    return load_config(config_file(tmp_path, text))


def test_projects_defaults_and_fair_share_load_in_base_units(tmp_path):
    config = load(tmp_path, GOOD)
    view = config.project_view()
    lab, vision = view.projects
    assert lab.limits == {"slots": 8, "mem": 2048 * 1024**2, "jobs": 3} and lab.admins == {"alice"}
    assert vision.limits == {"gpus": 2, "scratch": 100 * 1024**3, "lic": 1} and vision.groups == {"vis"}
    assert view.default == "lab" and view.group_defaults == {"vis": "lab/vision"}
    assert config.queues[0].fairshare.policy() == FairShare("project", 12 * 3600.0, {"lab/vision": 3.0}, 2.0, 4.0)


def test_without_projects_the_cluster_is_in_open_mode(tmp_path):
    view = load(tmp_path, BASE + "default_project: anything/at/all\n").project_view()
    assert view.open and view.default == "anything/at/all"


@pytest.mark.parametrize("extra, words", [
    ("projects: [{name: lab/vision}]", "projects (line 9): Value error, project lab/vision: its parent lab is "
                                       "not defined"),
    ("projects: [{name: lab}, {name: lab}]", "repeated: lab"),
    ("projects: [{name: lab, limits: {cpus: 2}}]", "'cpus' is not a resource of this cluster; limits take: slots, mem, "
                                                   "gpus, jobs, scratch, lic"),
    ("projects: [{name: lab, limits: {gpus: -1}}]", "gpus is a count: give a number of 0 or more"),
    ("projects: [{name: lab}]\ndefault_project: nope", "default_project: there is no project 'nope'"),
    ("projects: [{name: lab}]\ngroups: {g: {default_project: x}}", "groups.g.default_project: there is no project"),
    ("projects: [{name: 'lab//x'}]", "projects.0.name (line 9)"),
    ("projects: [{name: lab, owners: [a]}]", "projects.0.owners (line 9): Extra inputs are not permitted"),
])
def test_a_bad_project_says_where_and_what_to_do(tmp_path, extra, words):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, BASE + extra + "\n")
    assert str(tmp_path / "xce.yaml") in str(caught.value) and words in str(caught.value)


@pytest.mark.parametrize("fair, words", [
    ("{by: group}", "queues.0.fairshare.by"),
    ("{half_life: 0s}", "half_life"),
    ("{half_life: soon}", "queues.0.fairshare.half_life"),
    ("{shares: {alice: 0}}", "queues.0.fairshare.shares.alice"),
])
def test_a_bad_fair_share_policy_names_its_field(tmp_path, fair, words):
    with pytest.raises(ConfigError, match="line") as caught:
        load(tmp_path, BASE + f"    fairshare: {fair}\n")
    assert words in str(caught.value)
