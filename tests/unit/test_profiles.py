"""profiles.py and checks.py: applications.yaml as models, the built-in default, the cross-file
checks, and `xceadmin check` on the broken configurations kept in tests/data/configs/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import paths
from xce_lite.config.checks import review
from xce_lite.config.merge_values import Hook, Profile
from xce_lite.config.profiles import load_cluster
from xce_lite.errors import ConfigError

DATA = paths.DATA / "configs"
CLUSTER = """\
cluster: lab
hosts:
  - {name: h1, slots: 4, mem: 8G, tags: [avx512]}
queues:
  - {name: normal, default: true}
resources: {scratch: {kind: size}}
shared: {lic: 2}
"""


def home(tmp_path: Path, applications: str | None, extra: str = "") -> Path:
    (tmp_path / "xce.yaml").write_text(CLUSTER + textwrap.dedent(extra))
    if applications is not None:
        (tmp_path / "applications.yaml").write_text(textwrap.dedent(applications))
    return tmp_path / "xce.yaml"


def xceadmin(home_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xce_lite.cli.admin", "--home", str(home_dir), *args],
                          capture_output=True, text=True, timeout=60)


def test_without_a_file_there_is_the_built_in_default(tmp_path):
    config, profiles = load_cluster(home(tmp_path, None))
    assert config.default_application == "default" and list(profiles) == ["default"]
    assert profiles["default"].resources.select is None and not profiles["default"].env


def test_a_file_profile_named_default_replaces_the_built_in_one(tmp_path):
    _, profiles = load_cluster(home(tmp_path, "applications: {default: {env: {SITE: lab}}}"))
    assert dict(profiles["default"].env) == {"SITE": "lab"}


def test_an_empty_default_application_means_no_profile(tmp_path):
    config, _ = load_cluster(home(tmp_path, None, "default_application: ''\n"))
    assert config.default_application == ""


def test_every_attribute_of_the_good_example_loads():
    _, profiles = load_cluster(DATA / "good" / "xce.yaml")
    sim: Profile = profiles["sim"]
    assert (sim.min_tasks, sim.max_tasks, sim.default_tasks, sim.run_limit) == (1, 4, 2, 3600.0)
    assert [(e.name, e.per, e.default is not None) for e in sim.resources.rusage] == [
        ("mem", "task", True), ("lic", "job", True)]
    assert sim.hooks["post_job_exec"].timeout == 30.0 and sim.job_starter == ("nice", "-n", "5")
    assert [(p.name, p.default) for p in sim.params] == [("SOLVER", "direct")]


@pytest.mark.parametrize("applications, field, message", [
    ("applications: {sim: {envv: {}}}", "applications.sim.envv", "Extra inputs are not permitted"),
    ("applications: {sim: {kind: daemon}}", "applications.sim.kind", "String should match pattern"),
    ("applications: {sim: {env: {XCE_JOBID: '1'}}}", "applications.sim.env", "XCE_ names are set by xce"),
    ("applications: {sim: {tasks: {min: 4, max: 2}}}", "applications.sim.tasks", "min 4 is above max 2"),
    ("applications: {sim: {tasks: {max: 2, default: 3}}}", "applications.sim.tasks", "default 3 is outside"),
    ("applications: {sim: {resources: {span: 'ptile=0'}}}", "applications.sim.resources.span", "ptile"),
    ("applications: {sim: {resources: {rusage: {mem: {default: 2Q}}}}}",
     "applications.sim.resources.rusage.mem.default", "2Q"),
    ("applications: {sim: {resources: {rusage: {lic: 2G}}}}", "applications.sim.resources.rusage.lic",
     "lic is a count"),
    ("applications: {sim: {job_starter: ['']}}", "applications.sim.job_starter", "is a command"),
    ("applications: {sim: {hooks: {pre_job_exec: []}}}", "applications.sim.hooks.pre_job_exec.argv",
     "is a command"),
    ("applications: {sim: {hooks: {post_failure: fail}}}", "applications.sim.hooks.post_failure",
     "String should match pattern"),
    ("applications: {sim: {annotations: {'a.b': x, 'a_b': y}}}", "applications.sim.annotations",
     "both become XCE_APP_ANN_A_B"),
])
def test_broken_profiles_name_the_file_the_field_and_the_line(tmp_path, applications, field, message):
    with pytest.raises(ConfigError) as caught:
        load_cluster(home(tmp_path, applications))
    text = str(caught.value)
    assert f"{tmp_path / 'applications.yaml'}: {field} (line 1)" in text and message in text


def test_hooks_their_timeouts_and_their_two_switches_load(tmp_path):
    text = ("applications: {sim: {hooks: {pre_host_exec: [/bin/stage, in], post_job_exec: {argv: [/bin/tidy], "
            "timeout: 2m}, job_hooks: false, post_failure: exit}}}")
    sim = load_cluster(home(tmp_path, text))[1]["sim"]
    assert sim.hooks["pre_host_exec"] == Hook(("/bin/stage", "in"), None)
    assert sim.hooks["post_job_exec"] == Hook(("/bin/tidy",), 120.0)
    assert (sim.job_hooks, sim.post_failure) == (False, "exit")
    plain = load_cluster(home(tmp_path, "applications: {sim: {}}"))[1]["sim"]
    assert (plain.job_hooks, plain.post_failure) == (True, "record")  # the defaults


def test_warnings_secret_env_names_and_a_select_that_matches_no_host():
    found = review(load_cluster(DATA / "warnings" / "xce.yaml"), [])
    assert found.errors == []
    assert [w.split(":")[0] for w in found.warnings] == ["application gpu", "application gpu"]
    assert "DB_PASSWORD looks like a secret" in found.warnings[0]
    assert "select[defined(gpu_model)] matches no host" in found.warnings[1]


# ---- xceadmin check on the broken configurations of tests/data/configs -----------------------------

BROKEN = [
    ("bad_schema", "applications.yaml: applications.sim.limit (line 6): Extra inputs are not permitted"),
    ("bad_select", "applications.yaml: applications.sim.resources.select (line 4): "),
    ("undefined_default", "xce.yaml: default_application (line 7): no application profile 'nope' is defined"),
    ("unknown_resource", "applications.yaml: applications.sim.resources.rusage.licence (line 6): unknown resource"),
    ("secret_annotation", "applications.yaml: applications.sim.annotations (line 3): "
                          "Value error, annotation 'api_token' looks like a secret"),
    ("param_collision", "applications.yaml: applications.sim.params (line 3): "
                        "Value error, params 'threads' and 'THREADS' both become XCE_APP_PARAM_THREADS"),
]


@pytest.mark.parametrize("case, message", BROKEN, ids=[case for case, _ in BROKEN])
def test_xceadmin_check_refuses_a_broken_config_with_file_line_and_field(case, message):
    result = xceadmin(DATA / case, "check")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("xceadmin: ") and f"{DATA / case}/{message}" in result.stderr


def test_xceadmin_check_passes_a_good_config_and_prints_warnings():
    good = xceadmin(DATA / "good", "check")
    assert good.returncode == 0 and good.stdout.startswith("OK: ") and "0 warning(s)" in good.stdout, good.stderr
    warned = xceadmin(DATA / "warnings", "check")
    assert warned.returncode == 0 and warned.stdout.count("warning: application gpu") == 2


def test_xceadmin_check_writes_nothing(tmp_path):
    shutil.copytree(DATA / "good", tmp_path / "home")
    before = sorted(p.name for p in (tmp_path / "home").iterdir())
    assert xceadmin(tmp_path / "home", "check").returncode == 0
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == before
