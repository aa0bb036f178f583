"""A shared lab on one VM (issue 16, "Done when"): root makes a shared home and registers it as the
machine's default, starts its controller and a 2-host practice cluster; two students, real users of
this machine (made here, removed after), submit as themselves with no XCE_HOME, see each other's
jobs in `xce jobs -u all`, and each job ran as its submitter on a lab host; a student touches only
their own jobs, the teacher (an admin) every job. And the unit `xce controller unit` prints starts the
controller on a systemd test host, and systemd brings it back when it dies.

Everything is real: the CLI as each user (setpriv, with their groups), the controller as root, lab
hosts with systemd reached over ssh. The shared home and the users' homes live under
/var/lib/xce-tests (0711): users reach it, the hosts see it (not /tmp, not root's 0700 ~).

What waits for the controller side of issue 16 (branch sharedapi: the socket open to the socket
group, the caller's identity in the launch, permissions) is in the two tests marked NEEDS SHAREDAPI.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import readme
from tests.support.localusers import shared_dir, user_env, user_shims, xce_as
from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.config.cluster import load_config
from xce_lite.home import lab
from xce_lite.home.paths import Home

pytest_plugins = ["tests.support.testhosts_fixture"]


def root_env(base: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("XCE_", "XDG_", "SUDO_"))}
    return {**keep, "XDG_STATE_HOME": str(base / "state"), "XCE_DEFAULT_HOME_FILE": str(base / "etc" / "home")}


def xce_root(base: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "xce_lite", *args], env=root_env(base), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    return done


class Lab:
    """A teacher's lab: the shared home, its users (teacher, ann, bob in group `group`), their CLI."""

    def __init__(self, base: Path, users: list[testhosts.LocalUser], group: str):
        self.base, self.group = base, group
        self.home = base / "lab"
        self.teacher, self.ann, self.bob = users

    def xce(self, user: testhosts.LocalUser, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`xce ARGS` as `user`, with no home named: the machine's default (the registered file) is used."""
        done = xce_as(user, list(args), timeout=timeout,
                      XCE_DEFAULT_HOME_FILE=str(self.base / "etc" / "home"))
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
        return done

    def submit(self, user: testhosts.LocalUser, *args: str) -> str:
        done = self.xce(user, "submit", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("<")[1].split(">")[0]


@pytest.fixture
def base():
    with shared_dir("lab-") as path:
        yield path


@pytest.fixture
def teachers_lab(base, require_testhosts):
    """Root's part of the scenario, up to a running controller and `xce lab up 2`; all undone after."""
    require_testhosts(plain=False)
    tag = f"{os.getpid() % 100000}"
    group = f"xcelab{tag}"
    names = [f"xcet{tag}", f"xcea{tag}", f"xceb{tag}"]
    users = testhosts.add_local_users(names, base, group=group)
    lab_ = Lab(base, users, group)
    try:
        done = xce_root(base, "init", "--shared", str(lab_.home), "--admin", lab_.teacher.name, "--socket-group",
                        group, "--register")
        assert done.returncode == 0, done.stderr
        done = xce_root(base, "--home", str(lab_.home), "lab", "up", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        done = xce_root(base, "--home", str(lab_.home), "controller", "start")
        assert done.returncode == 0, done.stderr
        yield lab_
    finally:
        readme.stop_home(lab_.home, root_env(base))
        testhosts.remove_local_users(names, group)
    log = lab_.home / "controller.log"
    assert not log.exists() or "Traceback" not in log.read_text(), "the controller failed: see its log"


def test_a_teachers_lab_has_root_agents_on_hosts_that_know_the_users(teachers_lab: Lab):
    """What works with this branch alone: the home, the lab's hosts and what users may read of it."""
    home = teachers_lab.home
    config = load_config(home / "xce.yaml")
    assert (config.mode, config.admins, config.socket_group) == ("shared", [teachers_lab.teacher.name],
                                                                 teachers_lab.group)
    hosts = [h for h in config.hosts if lab.LAB_TAG in h.tags]
    assert [h.name for h in hosts] == ["lab1", "lab2"]
    record = lab.load(Home(home))
    for host in hosts:
        assert host.user == "root" and host.launch == "systemd"  # system units, with User= per job
        assert host.spool == f"{record.dir / lab.AGENTS}/{config.cluster}-{host.name}"
    assert stat.S_IMODE(record.dir.stat().st_mode) == 0o711
    assert stat.S_IMODE((record.dir / "id_ed25519").stat().st_mode) == 0o600
    # the hosts know this machine's users, with the same uids
    ann = teachers_lab.ann
    known = subprocess.run(["ssh", "-F", str(record.dir / "ssh_config"), "-o", "BatchMode=yes", "lab1", "id", "-u",
                            ann.name], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert known.stdout.strip() == str(ann.uid), known.stderr
    # a student reads the settings, lists nothing, reads nothing private
    assert teachers_lab.xce(ann, "queues").returncode in (0, 3)  # reaches the home; the socket is sharedapi's
    peek = subprocess.run(ann.argv(["ls", str(home)]), capture_output=True, text=True, timeout=30)
    assert peek.returncode != 0
    for private in (home / "xce.db", home / "controller.log", home / "spool", home / "known_hosts"):
        got = subprocess.run(ann.argv(["cat", str(private)]), capture_output=True, text=True, timeout=30)
        assert got.returncode != 0, f"{ann.name} read {private}"
    readable = subprocess.run(ann.argv(["cat", str(home / "xce.yaml")]), capture_output=True, text=True, timeout=30)
    assert readable.returncode == 0 and "mode: shared" in readable.stdout
    # the agents keep their directories in the lab's (root's, private), and `down` takes them away
    spools = [Path(h.spool) for h in hosts]
    wait_until(lambda: all((s / "units").is_dir() for s in spools), timeout=120, describe="the lab's agents up")
    for spool in spools:
        assert spool.stat().st_uid == 0 and stat.S_IMODE(spool.stat().st_mode) in (0o700, 0o711)
    down = xce_root(teachers_lab.base, "--home", str(home), "lab", "down")
    assert down.returncode == 0, down.stderr
    assert not (record.dir / lab.AGENTS).exists() and not any(s.exists() for s in spools)


def test_two_students_submit_see_each_others_jobs_and_each_ran_as_its_submitter(teachers_lab: Lab):
    """NEEDS SHAREDAPI: the socket open to the socket group, and each job's user from SO_PEERCRED."""
    t = teachers_lab
    ids = {}
    for student in (t.ann, t.bob):
        ids[student.name] = t.submit(student, "-R", "select[lab]", "-n", "2", "-o", "out-%J.txt", "--", "sh", "-c",
                                     'id -un; id -gn; hostname')
        ids[student.name + "-held"] = t.submit(student, "--hold", "--", "sleep", "60")
    for student in (t.ann, t.bob):
        done = t.xce(student, "wait", ids[student.name], timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        out = student.home / f"out-{ids[student.name]}.txt"
        lines = out.read_text().split()
        assert lines[:2] == [student.name, student.name] and lines[2] in ("lab1", "lab2")  # its user group
        assert (out.stat().st_uid, out.stat().st_gid) == (student.uid, student.gid)
    for student, other in ((t.ann, t.bob), (t.bob, t.ann)):
        listed = t.xce(student, "jobs", "-u", "all")
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
        assert rows.get(ids[other.name + "-held"]) == other.name, listed.stdout
        assert rows.get(ids[student.name + "-held"]) == student.name, listed.stdout
        mine = t.xce(student, "jobs")
        assert ids[other.name + "-held"] not in mine.stdout.split() and ids[student.name + "-held"] in mine.stdout


def test_a_student_touches_only_their_own_jobs_and_the_teacher_every_job(teachers_lab: Lab):
    """NEEDS SHAREDAPI: permissions (a refusal names who may), besides the socket and identity."""
    t = teachers_lab
    anns = t.submit(t.ann, "--hold", "--", "sleep", "60")
    bobs = t.submit(t.bob, "--hold", "--", "sleep", "60")
    for action in ("kill", "release"):
        refused = t.xce(t.bob, action, anns)
        assert refused.returncode != 0 and t.ann.name in refused.stderr, refused.stderr
    state = t.xce(t.ann, "jobs", anns)
    assert "PSUSP" in state.stdout, state.stdout  # untouched by bob
    assert t.xce(t.bob, "kill", bobs).returncode == 0
    assert t.xce(t.teacher, "kill", anns).returncode == 0  # an admin acts on every job
    for job in (anns, bobs):
        wait_until(lambda job=job: "EXIT" in t.xce(t.ann, "jobs", "-u", "all", "-a", job).stdout, timeout=60,
                   describe=f"job {job} killed")
    root_only = xce_root(t.base, "--home", str(t.home), "jobs", "-u", "all", "-a")
    assert anns in root_only.stdout and bobs in root_only.stdout


def test_the_printed_unit_starts_the_controller_on_a_systemd_host_and_brings_it_back(base, systemd_hosts):
    host = systemd_hosts[0]
    home = base / "lab"
    assert xce_root(base, "init", "--shared", str(home), "--admin", "root").returncode == 0
    unit = xce_root(base, "--home", str(home), "controller", "unit")
    assert unit.returncode == 0, unit.stderr
    # the host's /run is its own: a unit there changes nothing on this machine or the other hosts
    path = "/run/systemd/system/xce-controller.service"

    def in_host(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(host.nsenter_argv(list(argv)), capture_output=True, text=True, timeout=60)

    install = subprocess.run(host.nsenter_argv(["sh", "-c", f"cat > {path}"]), input=unit.stdout, text=True,
                             capture_output=True, timeout=60)
    assert install.returncode == 0, install.stderr
    try:
        assert in_host("systemctl", "daemon-reload").returncode == 0
        started = in_host("systemctl", "start", "xce-controller.service")
        assert started.returncode == 0, started.stderr

        def main_pid() -> int:
            shown = in_host("systemctl", "show", "-p", "MainPID", "--value", "xce-controller.service")
            return int(shown.stdout.strip() or 0)

        def answers() -> bool:  # and started: its ExecStartPost (waiting for an answer) is done
            active = in_host("systemctl", "is-active", "xce-controller.service").stdout.strip() == "active"
            return active and xce_root(base, "--home", str(home), "controller", "status").returncode == 0

        wait_until(answers, timeout=60, describe="the unit's controller answering")
        first = main_pid()
        assert first and in_host("kill", "-9", str(first)).returncode == 0  # a crash: Restart=on-failure
        wait_until(lambda: main_pid() not in (0, first) and answers(), timeout=60,
                   describe="systemd restarting the controller")
        assert in_host("systemctl", "stop", "xce-controller.service").returncode == 0
        state = in_host("systemctl", "status", "xce-controller.service").stdout
        assert "inactive (dead)" in state, state  # a planned stop: not `failed`
        assert xce_root(base, "--home", str(home), "controller", "status").returncode == 3
    finally:
        in_host("systemctl", "stop", "xce-controller.service")
        in_host("rm", "-f", path)
        in_host("systemctl", "daemon-reload")
        # its lock names a pid of the host's namespace: never let a clean-up signal that pid here
        (home / "controller.lock").unlink(missing_ok=True)


# ---- the README's "A shared lab", as printed ------------------------------------------------------

SHARED_BLOCKS = {b.options[1]: b for b in readme.blocks() if b.kind == "run" and "e2e-shared" in b.options}


def test_the_readme_blocks_of_a_shared_lab_are_these_three():
    assert sorted(SHARED_BLOCKS) == ["student", "teacher", "unit"]


def test_the_readme_shared_lab_runs_as_printed(base, systemd_hosts):
    """The teacher's block as root here, the unit's inside a systemd test host (its /run, so `/etc/systemd/
    system` becomes `/run/systemd/system` and `enable --now` `start`: nothing of this machine's boot
    changes), then the student's as each student. NEEDS SHAREDAPI for the student's block (the socket
    group, identity); the teacher's and the unit's pass with this branch alone."""
    host = systemd_hosts[0]
    tag = f"{os.getpid() % 100000}"
    group = f"xcers{tag}"
    names = [f"xcert{tag}", f"xcera{tag}", f"xcerb{tag}"]
    teacher, alice, bob = testhosts.add_local_users(names, base)
    home, default = base / "lab", base / "etc" / "home"
    words = {"/var/lib/xce_lite": str(home), "/etc/xce_lite/home": str(default), "students": group,
             "teacher": teacher.name, "alice": alice.name, "bob": bob.name,
             "/etc/systemd/system": "/run/systemd/system", "enable --now": "start"}

    def rewrite(text: str) -> str:
        for word, ours in words.items():
            text = text.replace(word, ours)
        return text

    root_home = base / "root-home"
    root_home.mkdir()
    env = {**readme.environment(root_home, readme.shims(base / "bin")), "XCE_DEFAULT_HOME_FILE": str(default)}
    unit = "/run/systemd/system/xce-controller.service"
    try:
        wrong = readme.problems(readme.run(SHARED_BLOCKS["teacher"], root_home, env, rewrite=rewrite), root_home,
                                rewrite=rewrite)
        assert not wrong, "\n\n".join(wrong)
        wrong = readme.problems(readme.run(SHARED_BLOCKS["unit"], root_home, env, rewrite=rewrite,
                                           wrap=host.nsenter_argv([])), root_home, rewrite=rewrite)
        assert not wrong, "\n\n".join(wrong)
        shims = user_shims(base / "user-bin")
        for student in (alice, bob):
            out = student.home / ".readme-test"
            out.mkdir()
            os.chown(out, student.uid, student.gid)
            student_env = {**user_env(student), "PATH": f"{shims}:/usr/bin:/bin",
                           "XCE_DEFAULT_HOME_FILE": str(default)}
            wrong = readme.problems(readme.run(SHARED_BLOCKS["student"], student.home, student_env,
                                               rewrite=rewrite, wrap=student.argv([])), student.home,
                                    rewrite=lambda text, s=student: rewrite(text).replace(alice.name, s.name))
            assert not wrong, f"as {student.name}:\n" + "\n\n".join(wrong)
    finally:
        for argv in (["systemctl", "stop", "xce-controller.service"], ["rm", "-f", unit],
                     ["systemctl", "daemon-reload"]):
            subprocess.run(host.nsenter_argv(argv), capture_output=True, timeout=60)
        # its lock names a pid of the host's namespace: never let a clean-up signal that pid here
        (home / "controller.lock").unlink(missing_ok=True)
        readme.stop_home(home, env)
        testhosts.remove_local_users(names, group)
