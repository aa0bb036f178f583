"""What a newcomer meets in the first minutes (issue "first contact"): a controller start that fails
says only its own error, a stray yaml.py in the working directory is never imported, `xce wait`
says each end as it happens, shell completion names the cluster's things, `xce init` gives a second
home a name of its own. Real parts: the CLI as a subprocess, a real controller, a real terminal
(a pty) where the test is about one."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from xce_lite import errors
from xce_lite.api.client import Client


def test_a_failed_start_prints_only_its_own_error_never_an_earlier_one(idle_cluster: Cluster):
    c = idle_cluster
    config = c.home / "xce.yaml"
    good = config.read_text()
    config.write_text(good.replace("slots: 2", "slots: zero"))
    first = c.xce("controller", "start")
    assert first.returncode == 2 and "hosts.0.slots (line 4)" in first.stderr
    config.write_text(good.replace("priority: 50", "priority: -1"))
    second = c.xce("controller", "start")
    assert second.returncode == 2 and "queues.1.priority" in second.stderr
    assert "slots" not in second.stderr, "the first start's (fixed) error was printed again"
    assert "Traceback" not in first.stderr + second.stderr
    assert first.stderr.startswith("xce: the controller exited at start (code 2):\n")
    config.write_text(good)
    c.start()


def test_a_yaml_py_or_json_py_in_the_working_directory_is_never_imported(idle_cluster: Cluster):
    c = idle_cluster
    for name in ("yaml.py", "json.py", "apsw.py", "click.py"):
        (c.work / name).write_text(f"raise SystemExit('imported {name} from the working directory')\n")
    c.start()  # runs in c.work, as `python -m xce_lite` would from there
    job = c.submit("true")
    assert c.xce("wait", "-q", str(job)).returncode == 0
    assert "imported" not in (c.home / "controller.log").read_text()


def _pty_run(argv: list[str], env: dict, cwd: Path):
    """Start `argv` with its stdout on a real terminal; (process, read_output) where read_output()
    returns all the terminal got so far."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    got = bytearray()

    def read() -> str:
        import select

        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            got.extend(chunk)
        return got.decode(errors="replace")

    return proc, read, master


def test_wait_says_each_end_as_it_happens_on_a_terminal_and_is_quiet_with_q(cluster: Cluster):
    c = cluster
    first = c.submit("true")
    held = c.submit("true", options=("--hold",))
    proc, read, master = _pty_run([sys.executable, "-m", "xce_lite", "wait", str(first), str(held)], c.env, c.work)
    try:
        wait_until(lambda: f"Job <{first}> DONE: exit code 0" in read(), 30, "wait to say the first job's end")
        assert proc.poll() is None, "wait ended before the held job did"
        assert f"Job <{held}>" not in read()
        c.ok("kill", str(held))
        wait_until(lambda: (read(), proc.poll())[1] is not None, 30, "wait to end once the held job is killed")
        assert proc.returncode == 1
        wait_until(lambda: f"Job <{held}> EXIT" in read(), 10, "wait to say the killed job's end")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    quiet = c.xce("wait", "-q", str(first), str(held))
    assert quiet.returncode == 1 and quiet.stdout == "" and quiet.stderr == ""
    # -q asks for the counts alone (brief): the states of the jobs named, each counted once
    waiting = c.submit("true", options=("--hold",))
    api = Client(c.home / "xce.sock")
    try:
        brief = api.get("/jobs/wait", ids=f"{first},{held},{first}", timeout=5, brief=True)
        assert brief == {"schema": 1, "finished": True, "states": {"DONE": 1, "EXIT": 1}, "arrays": {}}
        brief = api.get("/jobs/wait", ids=f"{first},{waiting}", timeout=0.2, brief=True)
        assert brief == {"schema": 1, "finished": False, "states": {"DONE": 1, "PSUSP": 1}, "arrays": {}}
    finally:
        api.close()
    c.ok("kill", str(waiting))
    doc = json.loads(c.ok("wait", "--json", str(first)))
    assert doc["schema"] == 1 and doc["finished"] and doc["jobs"][0]["state"] == "DONE"


def test_wait_on_an_array_draws_a_progress_line_on_a_terminal_and_names_each_failure(cluster: Cluster):
    c = cluster
    array = c.submit("sh", "-c", 'exit $(( XCE_ARRAY_INDEX == 3 ))', options=("-J", "a[1-4]%1"))
    proc, read, master = _pty_run([sys.executable, "-m", "xce_lite", "wait", str(array)], c.env, c.work)
    try:  # reading as it goes: a terminal that nobody reads would block the writer
        wait_until(lambda: (read(), proc.poll())[1] is not None, 60, "wait to end with the array")
        assert proc.returncode == 1
        wait_until(lambda: f"Array <{array}>: 3 DONE, 1 EXIT, 0 running, 0 pending (of 4)" in read(), 10,
                   "the array's summary line")
        out = read()
    finally:
        os.close(master)
    assert f"Job <{array + 2}> EXIT: exit code 1" in out or f"Job <{array}[3]> EXIT: exit code 1" in out
    assert "\r\x1b[K" in out and "pending (of 4)" in out  # the progress line, redrawn in place
    piped = c.xce("wait", str(array))
    assert piped.returncode == 1 and "\r" not in piped.stdout
    assert piped.stdout.splitlines()[-1] == f"Array <{array}>: 3 DONE, 1 EXIT, 0 running, 0 pending (of 4)"


def test_wait_on_many_jobs_polls_counts_and_the_failures_only_and_sums_them_up(cluster: Cluster):
    """Plain `xce wait` on many jobs asks brief replies: the counts per state and per array, the
    records of the failures, and those of the jobs of their own only when there are a few (four
    arrays of 10,000: the records took the controller 2.4 s per poll, the counts ~0.1 s)."""
    c = cluster
    api = Client(c.home / "xce.sock")
    try:
        spec = {"cwd": str(c.work), "env": {}}
        jobs = [{**spec, "argv": ["sh", "-c", f"exit {int(k == 7)}"]} for k in range(25)]  # the 8th fails
        singles = api.post("/jobs", {"jobs": jobs})["ids"]
        (array,) = api.post("/jobs", {"jobs": [{**spec, "argv": ["true"], "array": "1-3"}]})["ids"]
        ids = ",".join(map(str, [*singles, array]))
        reply = api.get("/jobs/wait", ids=ids, timeout=60, brief=True, list="exit", singles=20)
        assert reply["finished"] and reply["states"] == {"DONE": 27, "EXIT": 1}
        assert reply["arrays"] == {str(array): {"DONE": 3}}
        assert [j["id"] for j in reply["jobs"]] == [singles[7]]  # 25 of their own: the failure alone
        few = api.get("/jobs/wait", ids=ids, timeout=5, brief=True, singles=25)
        assert [j["id"] for j in few["jobs"]] == singles  # at most 25 of their own: each, the elements not
        with pytest.raises(errors.SpecError, match="list names no state of a job: 'ENDED'"):
            api.get("/jobs/wait", ids=ids, timeout=5, brief=True, list="ENDED")
        with pytest.raises(errors.SpecError, match="singles must be a whole number"):
            api.get("/jobs/wait", ids=ids, timeout=5, brief=True, singles="-1")
    finally:
        api.close()
    waited = c.xce("wait", *map(str, singles), str(array))
    assert waited.returncode == 1, waited.stderr
    assert waited.stdout.splitlines() == [
        f"Job <{singles[7]}> EXIT: exit code 1",
        f"Array <{array}>: 3 DONE, 0 EXIT, 0 running, 0 pending (of 3)",
        "Jobs: 24 DONE, 1 EXIT, 0 running, 0 pending (of 25)"]


def _complete(c: Cluster, words: str) -> list[str]:
    """What bash completion offers after `words` (the last word is the one being completed)."""
    parts = words.split(" ")
    env = dict(c.env, _XCE_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1))
    result = subprocess.run([sys.executable, "-m", "xce_lite", *parts[1:]], env=env, capture_output=True, text=True,
                            timeout=60, cwd=c.work)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines() if "," in line]


def test_completion_offers_job_ids_queues_hosts_profiles_and_presets(cluster: Cluster):
    c = cluster
    held = c.submit("sleep", "60", options=("--hold", "-J", "waiting"))
    c.env["XDG_CONFIG_HOME"] = str(c.root / "config")
    c.ok("preset", "save", "sweepy", "-n", "1")
    assert str(held) in _complete(c, "xce kill ")
    assert str(held) in _complete(c, "xce why ")
    assert _complete(c, "xce submit -q ") == ["normal", "high"]
    assert "local" in _complete(c, "xce hosts -l ")
    assert _complete(c, "xce submit -q h") == ["high"]
    assert "default" in _complete(c, "xce submit -app ")
    assert _complete(c, "xce submit --preset sw") == ["sweepy"]
    assert _complete(c, "xce preset show ") == ["sweepy"]
    c.ok("kill", str(held))
    c.ok("controller", "stop")
    assert _complete(c, "xce kill ") == []  # no controller: no candidates, and no error


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_second_home_gets_a_cluster_name_of_its_own_and_says_so(idle_cluster: Cluster, state_dir: Path):
    c = idle_cluster
    env = dict(c.env, XDG_STATE_HOME=str(state_dir))
    homes = [c.root / "first", c.root / "second", c.root / "third"]
    names = []
    for home in homes:
        result = c.xce("--home", str(home), "init", env=env)
        assert result.returncode == 0, result.stderr
        names.append(_cluster(home))
    assert len(set(names)) == 3 and names[0] in ("xce", "xce2", "xce3", "xce4")
    second = c.xce("--home", str(homes[1]), "init", env=env)
    assert second.returncode == 2  # exists already
    said = c.xce("--home", str(c.root / "fourth"), "init", env=env).stdout
    assert f"is taken by the cluster home {homes[0]}" in said or "is taken by" in said
    clash = c.xce("--home", str(c.root / "fifth"), "init", "--cluster", names[1], env=env)
    assert clash.returncode == 2 and f"already used by the cluster home {homes[1]}" in clash.stderr
    assert not (c.root / "fifth" / "xce.yaml").exists()
    bad = c.xce("--home", str(c.root / "sixth"), "init", "--cluster", "bad name!", env=env)
    assert bad.returncode == 2 and "is not valid" in bad.stderr and not (c.root / "sixth" / "xce.yaml").exists()
    for home in homes:  # a home removed frees its name for the next one
        (home / "xce.yaml").unlink()
    again = c.root / "seventh"
    assert c.xce("--home", str(again), "init", env=env).returncode == 0
    assert _cluster(again) == names[0]


def _cluster(home: Path) -> str:
    import yaml

    return yaml.safe_load((home / "xce.yaml").read_text())["cluster"]


def test_examples_copy_gives_the_tour_its_files_and_is_safe_to_repeat(tmp_path):
    dest = tmp_path / "tour"
    run = [sys.executable, "-m", "xce_lite", "examples", "copy", str(dest)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and first.stdout.startswith("Copied ")
    for name in ("sweep.sh", "sim.sh", "hello.sh", "pipeline/flow.yaml", "pipeline/pipeline.py", "sim/gpu/xce.yaml"):
        assert (dest / name).is_file(), name
    assert os.access(dest / "sweep.sh", os.X_OK) and os.access(dest / "sim.sh", os.X_OK)
    (dest / "sweep.sh").write_text("#!/bin/sh\necho mine\n")
    again = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "Copied 0 example file(s)" in again.stdout
    assert f"Kept your changed {dest / 'sweep.sh'}" in again.stdout
    assert (dest / "sweep.sh").read_text() == "#!/bin/sh\necho mine\n"
    forced = subprocess.run(run + ["--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0 and "Copied 1 example file(s)" in forced.stdout


def test_errors_come_message_first_then_the_usage_and_version_is_there(idle_cluster: Cluster):
    c = idle_cluster
    usage = c.xce("submit", "-n", "0", "--", "true")
    assert usage.returncode == 2 and usage.stdout == ""
    first, second, third = usage.stderr.splitlines()
    assert first == "xce: Invalid value for -n: '0': need 1 <= MIN <= MAX"
    assert second.startswith("Usage: xce submit [OPTIONS]") and third == "Try 'xce submit -h' for help."
    ours = c.xce("jobs")  # an error of xce's own: the same first line, no usage
    assert ours.returncode == 3 and ours.stderr.startswith("xce: the controller is not running")
    bad_host = c.xce("hosts", "add", "bad name!")
    assert bad_host.returncode == 2 and bad_host.stderr.startswith("xce: Invalid value for NAME: 'bad name!' is not")
    assert "Traceback" not in usage.stderr + ours.stderr + bad_host.stderr
    from xce_lite import __version__

    assert c.ok("--version").strip() == f"xce {__version__}"


def test_every_data_command_speaks_json(cluster: Cluster):
    c = cluster
    c.env["XDG_CONFIG_HOME"] = str(c.root / "config")
    held = c.submit("true", options=("--hold",))
    c.ok("preset", "save", "quick", "-W", "5m")
    c.submit("true", options=("--preset", "quick"))
    docs = {
        "why": c.ok("why", str(held), "--json"), "controller status": c.ok("controller", "status", "--json"),
        "preset list": c.ok("preset", "list", "--json"), "preset report": c.ok("preset", "report", "quick", "--json"),
        "wait": c.ok("wait", "--json", str(held + 1)),
    }
    for name, text in docs.items():
        assert json.loads(text)["schema"] == 1, name
    assert json.loads(docs["why"])["state"] == "PSUSP"
    assert json.loads(docs["controller status"])["running"] is True
    assert [p["name"] for p in json.loads(docs["preset list"])["presets"]] == ["quick"]
    assert [j["id"] for j in json.loads(docs["preset report"])["jobs"]] == [held + 1]
    lab_status = c.xce("lab", "status", "--json")
    assert lab_status.returncode == 1 and json.loads(lab_status.stdout) == {"schema": 1, "lab": False, "hosts": []}
    c.ok("kill", str(held))
    c.ok("controller", "stop")
    down = c.xce("controller", "status", "--json")
    assert down.returncode == 3 and json.loads(down.stdout)["running"] is False


def test_lab_up_refuses_a_cluster_name_another_home_uses_before_anything_starts(idle_cluster: Cluster,
                                                                               state_dir: Path):
    c = idle_cluster
    env = dict(c.env, XDG_STATE_HOME=str(state_dir))
    first = c.root / "first"
    assert c.xce("--home", str(first), "init", "--cluster", "twin", env=env).returncode == 0
    second = c.root / "second"
    second.mkdir()
    (second / "xce.yaml").write_text((first / "xce.yaml").read_text())  # an old home, made by copying
    refused = c.xce("--home", str(second), "lab", "up", "1", "--plain", env=env)
    assert refused.returncode == 1 and f"also used by the cluster home {first}" in refused.stderr
    assert "Give this home another `cluster:`" in refused.stderr
    assert not (second / "lab.json").exists() and not (second / "lab").exists()


def test_hosts_l_advises_only_modes_better_than_the_one_in_use():
    from xce_lite.cli.hosts import agent_line

    modes = {"systemd": {"ok": False, "why": "not root"}, "user": {"ok": False, "why": "enable linger"},
             "plain": {"ok": True}}
    base = {"hostname": "h", "cpus": 2, "mem": 2**30, "version": 2, "load": [0.5, 0.25, 0.0], "modes": modes}
    plain = agent_line({**base, "mode": "plain"})
    assert "no systemd system units: not root" in plain and "no systemd user units: enable linger" in plain
    assert "load 0.50 0.25 0.00 (when it connected)" in plain
    user = agent_line({**base, "mode": "user", "modes": {**modes, "user": {"ok": True}}})
    assert "not root" in user and "linger" not in user
    system = agent_line({**base, "mode": "systemd", "modes": {**modes, "systemd": {"ok": True}}})
    assert "no " not in system.split("\n", 1)[-1] and "linger" not in system
