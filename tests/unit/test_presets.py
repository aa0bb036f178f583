"""Presets: the client-side round trip (save, list, show, export, import, rm), how a preset and the
command line combine, and against a real controller: submit with a preset (its name, hash and
fields in the job's meta), `xce preset report`, and pulling admin presets (collisions, --as,
--force with a .bak, re-read on change).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from xce_lite.cli.submit import build_spec, expand
from xce_lite.config.presets import Preset


def xce(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = env or dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), XCE_HOME=str(tmp_path / "nohome"))
    return subprocess.run([sys.executable, "-m", "xce_lite", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)


def local(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "config" / "xce" / "presets" / f"{name}.json").read_text())


def test_save_list_show_export_import_rm_round_trip(tmp_path):
    saved = xce(tmp_path, "preset", "save", "sweep", "-n", "2,4", "-R", "rusage[mem=1G]", "-W", "30m",
                "--env", "MODE=fast", "--description", "a sweep")
    assert saved.returncode == 0 and "Preset sweep saved" in saved.stdout, saved.stderr
    assert local(tmp_path, "sweep") == {"schema": 1, "name": "sweep", "description": "a sweep", "options": {
        "tasks": "2,4", "resreq": ["rusage[mem=1G]"], "env": ["MODE=fast"], "run_limit": "30m"}}
    folder = tmp_path / "config" / "xce" / "presets"  # --env values may be secrets: this user's alone
    modes = [oct(p.stat().st_mode & 0o777) for p in (folder, folder / "sweep.json")]
    assert modes == ["0o700", "0o600"]
    listed = xce(tmp_path, "preset", "list").stdout
    assert "sweep" in listed and "a sweep" in listed
    shown = xce(tmp_path, "preset", "show", "sweep").stdout
    assert "xce submit -n 2,4 -R 'rusage[mem=1G]' --env MODE=fast -W 30m -- CMD" in shown
    assert xce(tmp_path, "preset", "export", "sweep", "-o", "sweep.json").returncode == 0
    assert xce(tmp_path, "preset", "rm", "sweep").returncode == 0
    assert xce(tmp_path, "preset", "show", "sweep").returncode == 2  # gone
    imported = xce(tmp_path, "preset", "import", "sweep.json", "--as", "sweep2")
    assert imported.returncode == 0, imported.stderr
    assert local(tmp_path, "sweep2")["options"]["tasks"] == "2,4" and local(tmp_path, "sweep2")["name"] == "sweep2"


def test_collisions_are_refused_and_force_keeps_a_backup(tmp_path):
    assert xce(tmp_path, "preset", "save", "p", "-W", "10m").returncode == 0
    again = xce(tmp_path, "preset", "save", "p", "-W", "20m")
    assert again.returncode == 2 and "a preset p exists already" in again.stderr and "--force" in again.stderr
    assert xce(tmp_path, "preset", "save", "p", "-W", "20m", "--force").returncode == 0
    directory = tmp_path / "config" / "xce" / "presets"
    assert json.loads((directory / "p.json.bak").read_text())["options"] == {"run_limit": "10m"}
    assert local(tmp_path, "p")["options"] == {"run_limit": "20m"}


@pytest.mark.parametrize("args, message", [
    (("-W", "3x"), "invalid value for -W: run limit (-W) '3x' is not a duration"),
    (("-n", "4,2"), "need 1 <= MIN <= MAX"),
    (("--env", "NOEQUALS"), "'NOEQUALS' is not NAME=VALUE"),
    ((), "give the submit options to save"),
])
def test_a_preset_that_would_not_submit_is_not_saved(tmp_path, args, message):
    result = xce(tmp_path, "preset", "save", "bad", *args)
    assert result.returncode == 2 and message.lower() in result.stderr.lower(), result.stderr
    assert not (tmp_path / "config" / "xce" / "presets" / "bad.json").exists()


def test_the_command_line_wins_env_and_params_merge_by_name_and_R_replaces():
    preset = Preset("p", {"tasks": "2", "resreq": ["rusage[mem=1G]"], "env": ["A=preset", "B=preset"],
                          "app_param": ["X=1"], "queue": "short"})
    options, from_preset = expand({"tasks": "4", "resreq": ["rusage[mem=2G]"], "env": ["B=cli"],
                                   "app_param": ["Y=2"]}, preset)
    assert options == {"tasks": "4", "resreq": ["rusage[mem=2G]"], "env": ["A=preset", "B=cli"],
                       "app_param": ["X=1", "Y=2"], "queue": "short"}
    assert from_preset == ["app_param", "env", "queue"]  # what the preset supplied any of
    spec = build_spec(options, ["true"], preset, from_preset)
    assert spec["exdata"]["meta"] == {"preset": {"name": "p", "hash": preset.hash,
                                                 "fields": ["app_params", "env", "queue"]}}
    assert spec["exdata"]["app_params"] == {"X": "1", "Y": "2"} and spec["slots"] == 4


# ---- against a controller -------------------------------------------------------------------------


@pytest.fixture
def preset_cluster(cluster: Cluster):
    cluster.env["XDG_CONFIG_HOME"] = str(cluster.root / "config")
    return cluster


def test_submit_with_a_preset_records_it_and_report_lists_the_jobs(preset_cluster: Cluster):
    c = preset_cluster
    c.ok("preset", "save", "quick", "-W", "5m", "-J", "from-preset")
    job_id = c.submit("true", options=("--preset", "quick", "-J", "mine"))
    plain = c.submit("true")
    job = c.job(job_id)
    assert job["name"] == "mine" and job["run_limit"] == 300.0  # the command line wins; the preset fills in
    assert job["meta"]["preset"]["name"] == "quick" and job["meta"]["preset"]["fields"] == ["run_limit"]
    assert re.search(r"\n    run limit +0:05:00 +\[preset\]\n", c.ok("jobs", "-l", str(job_id)))
    report = c.ok("preset", "report", "quick")
    assert f"\n{job_id} " in report and "(current)" in report and f"\n{plain} " not in report
    c.ok("preset", "save", "quick", "-W", "6m", "--force")
    assert "(current)" not in c.ok("preset", "report", "quick")  # submitted with an older version
    missing = c.xce("submit", "--preset", "nosuch", "--", "true")
    assert missing.returncode == 2 and "no preset nosuch" in missing.stderr


def test_pull_admin_presets_collisions_as_and_force(preset_cluster: Cluster):
    c = preset_cluster
    admin = c.home / "config" / "presets"
    admin.mkdir(parents=True)
    (admin / "gpu.json").write_text(json.dumps({"name": "gpu", "description": "site GPU jobs",
                                                "options": {"gpus": 1, "-W": "1h"}}))
    (admin / "train.json").write_text(json.dumps({"name": "train", "options": {"tasks": "2", "run_limit": "1h"}}))
    listed = c.xce("preset", "list", "--server")
    assert "train" in listed.stdout and "gpu.json: options.-W is not a submit option" in listed.stderr

    pulled = c.ok("preset", "pull", "train")
    assert f"Preset train pulled from t{os.getpid()}:train" in pulled
    mine = json.loads((c.root / "config" / "xce" / "presets" / "train.json").read_text())
    assert mine["origin"]["name"] == "train" and mine["options"] == {"tasks": "2", "run_limit": "1h"}

    (admin / "train.json").write_text(json.dumps({"name": "train", "options": {"tasks": "4"}}))  # re-read
    assert "pulled" in c.ok("preset", "pull", "train")  # an update of the same server preset
    assert json.loads((c.root / "config" / "xce" / "presets" / "train.json").read_text())["options"] == {"tasks": "4"}

    c.ok("preset", "save", "mine", "-W", "1m")
    (admin / "mine.json").write_text(json.dumps({"name": "mine", "options": {"queue": "high"}}))
    refused = c.xce("preset", "pull", "mine")
    assert refused.returncode == 2 and "was not pulled from" in refused.stderr and "--as NEW" in refused.stderr
    assert "Preset other pulled" in c.ok("preset", "pull", "mine", "--as", "other")
    forced = c.ok("preset", "pull", "mine", "--force")
    assert "the old one is kept as mine.json.bak" in forced
    directory = c.root / "config" / "xce" / "presets"
    assert json.loads((directory / "mine.json.bak").read_text())["options"] == {"run_limit": "1m"}
    assert json.loads((directory / "mine.json").read_text())["options"] == {"queue": "high"}
    job_id = c.submit("true", options=("--preset", "other"))
    assert c.job(job_id)["queue"] == "high"
