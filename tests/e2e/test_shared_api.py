"""A shared lab's controller, end to end (issue 16, and issue 17's project admins): a real controller
as root in `mode: shared`, real local users (made here, removed after) running the real `xce` CLI
as themselves, jobs on this machine's local host and on a plain test host over SSH.

What a user may do to others' jobs is refused with who may; each job runs as its submitter, its
output is theirs; queue ACLs and the submitter's own permissions on the job's directories are
checked at submit; others' jobs are listed without their command line (visibility: summary).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, hosts_ok
from tests.support.localusers import shared_dir, xce_as
from tests.support.remote import remote_config
from tests.support.waiting import wait_until
from xce_lite.testhosts import LocalUser, add_local_users, remove_local_users

TAG = f"{os.getpid() % 100000}"
ALICE, BOB, BOSS, CAROL = (f"xsa{TAG}", f"xsb{TAG}", f"xsc{TAG}", f"xsd{TAG}")
GROUP = f"xsg{TAG}"
BOUNDED = "i=0; while [ $((i += 1)) -lt 600 ]; do sleep 0.1; done"  # a job that gives up by itself in a minute


def shared_config(hosts: str) -> str:
    return f"""\
cluster: sh{TAG}
mode: shared
admins: [{BOSS}]
visibility: summary
hosts:
{hosts}queues:
  - {{name: normal, default: true}}
  - {{name: gpu, groups: [{GROUP}]}}
projects:
  - {{name: lab, members: [{ALICE}, {BOB}], admins: [{CAROL}]}}
  - {{name: lab/vision, members: [{ALICE}, {BOB}]}}
default_project: lab
controller: {{tick: 1s, grace: 1s}}
"""


@pytest.fixture(scope="module")
def users():
    names = [ALICE, BOB, BOSS, CAROL]
    with shared_dir("homes-") as homes:
        made = add_local_users(names, homes, group=GROUP, members=[ALICE])
        try:
            yield {user.name: user for user in made}
        finally:
            remove_local_users(names, GROUP)


@pytest.fixture
def work():
    with shared_dir() as path:
        yield path


def own_dir(base: Path, user: LocalUser) -> Path:
    """`user`'s private directory under `base` (0700, theirs)."""
    path = base / user.name
    path.mkdir()
    os.chown(path, user.uid, user.gid)
    path.chmod(0o700)
    return path


def xce(user: LocalUser, home: Path, *args: str, cwd: Path | None = None):
    """`xce ARGS` run as `user` against the cluster home `home`."""
    return xce_as(user, list(args), cwd=cwd, XCE_HOME=str(home))


def start(config: str, applications: str | None = None) -> Cluster:
    c = Cluster(config=config)
    if applications is not None:
        (c.home / "applications.yaml").write_text(applications)
    c.root.chmod(0o711)  # the users reach the socket in the home (the controller opens the home 0711)
    c.start()
    return c


def finish(c: Cluster) -> None:
    """The final check (no traceback in the controller's log), then the cluster stopped."""
    try:
        log = (c.home / "controller.log").read_text() if (c.home / "controller.log").exists() else ""
        assert "Traceback" not in log, f"the controller's log has a traceback:\n{log[-3000:]}"
    finally:
        c.close()


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result, *words: str) -> str:
    assert result.returncode != 0, f"expected a refusal, got:\n{result.stdout}"
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, f"{word!r} not in:\n{result.stderr}"
    return result.stderr


def submit(entry, c: Cluster, cwd: Path, *args: str) -> int:
    return int(ok(xce(entry, c.home, "submit", "--parsable", *args, cwd=cwd)).strip())


def job_of(c: Cluster, job_id: int) -> dict:
    return c.job(job_id)  # as root: an admin sees everything


def test_users_act_on_their_own_jobs_admins_and_project_admins_on_all(users, work):
    a, b, boss, carol = (users[n] for n in (ALICE, BOB, BOSS, CAROL))
    a_dir, b_dir = own_dir(work, a), own_dir(work, b)
    c = start(shared_config("  - {name: local, slots: 4, mem: 1G}\n"))
    try:
        assert oct(c.home.stat().st_mode & 0o777) == "0o711"
        assert oct((c.home / "xce.sock").stat().st_mode & 0o777) == "0o666"
        # each job runs as its submitter, and its output is theirs
        ja = submit(a, c, a_dir, "-J", "a-secret-name", "--", "sh", "-c",
                    'id -un; echo s > "$XCE_JOB_HOST_DIR/scratch" && stat -c "scratch=%U" "$XCE_JOB_HOST_DIR/s"*; '
                    f"{BOUNDED}")
        jb = submit(b, c, b_dir, "-P", "lab/vision", "--", "sh", "-c", f"id -un; {BOUNDED}")
        for job_id, entry, where in ((ja, a, a_dir), (jb, b, b_dir)):
            c.wait_state(job_id, {"RUN"})
            out = where / f"xce-{job_id}.out"
            wait_until(lambda out=out: out.exists() and out.read_text().strip(), 30, f"job {job_id}'s output")
            assert out.read_text().splitlines()[0] == entry.name
            assert (out.stat().st_uid, out.stat().st_gid) == (entry.uid, entry.gid)
        wait_until(lambda: f"scratch={ALICE}" in (a_dir / f"xce-{ja}.out").read_text(), 30,
                   "A's job to write in its XCE_JOB_HOST_DIR on the local host")
        # B may not kill, hold, peek or ask why of A's job: each refusal names who may
        for action in (["kill", str(ja)], ["hold", str(ja)], ["peek", str(ja)], ["suspend", str(ja)],
                       ["requeue", str(ja)]):
            refused(xce(b, c.home, *action), f"{BOB} may not", f"belongs to {ALICE}", f"its owner {ALICE}",
                    BOSS, f"the admins of project lab ({CAROL})")
        assert job_of(c, ja)["state"] == "RUN"
        # everyone's jobs with -u all; by default one's own; A's command hidden from B (visibility: summary)
        mine = json.loads(ok(xce(b, c.home, "jobs", "--json")))["jobs"]
        assert [j["id"] for j in mine] == [jb]
        listed = {j["id"]: j for j in json.loads(ok(xce(b, c.home, "jobs", "--json", "-u", "all")))["jobs"]}
        assert set(listed) == {ja, jb}
        assert "command" not in listed[ja] and "cwd" not in listed[ja] and "command" in listed[jb]
        assert listed[ja]["user"] == ALICE and listed[ja]["state"] == "RUN"
        long_text = ok(xce(b, c.home, "jobs", "-l", "-u", "all"))
        assert "id -un" in long_text and long_text.count("id -un") == 1  # B's own command only
        assert "shown to its owner" in long_text
        history = {j["id"]: j for j in json.loads(ok(xce(b, c.home, "hist", "-u", "all", "--json")))["jobs"]}
        assert "command" not in history[ja] and history[jb]["command"][0] == "sh"
        assert "id -un" not in ok(xce(b, c.home, "hist", str(ja)))
        assert "id -un" in ok(xce(a, c.home, "hist", str(ja)))  # the owner sees it all
        # a project admin acts on the jobs of the project's subtree (lab/vision under lab)
        ok(xce(carol, c.home, "suspend", str(ja)))
        c.wait_state(ja, {"USUSP"})
        ok(xce(carol, c.home, "resume", str(ja)))
        c.wait_state(ja, {"RUN"})
        ok(xce(carol, c.home, "kill", str(jb)))
        c.wait_state(jb, {"EXIT"})
        # an admin acts on any job; the owner on their own
        ok(xce(boss, c.home, "peek", str(ja)))
        ok(xce(a, c.home, "kill", str(ja)))
        assert c.wait_state(ja, {"EXIT"})["reason"] == f"killed by {ALICE}"
        quiet = xce(b, c.home, "wait", "-q", str(ja), str(jb))  # the counts alone, under visibility: summary
        assert (quiet.returncode, quiet.stdout, quiet.stderr) == (1, "", "")
        # queue ACLs: gpu takes jobs from group GROUP (A) and admins only
        refused(xce(b, c.home, "submit", "-q", "gpu", "--", "true", cwd=b_dir),
                "queue gpu takes jobs only from members of group(s) " + GROUP, f"{BOB} is not one of them")
        assert f"(for @{GROUP})" in ok(xce(b, c.home, "queues"))
        jg = submit(a, c, a_dir, "-q", "gpu", "--", "true")
        assert c.wait_state(jg, {"DONE", "EXIT"})["state"] == "DONE"
        # the job's directories are checked with the submitter's own permissions
        refused(xce(b, c.home, "submit", "--cwd", str(a_dir), "--", "true", cwd=b_dir),
                f"working directory {a_dir}", f"user {BOB} cannot read and enter it")
        refused(xce(b, c.home, "submit", "-o", f"{a_dir}/stolen.out", "--", "true", cwd=b_dir),
                f"output directory {a_dir}", f"user {BOB} cannot write there")
        assert not (a_dir / "stolen.out").exists()
        # usage (visibility: summary): one's own; a project's for its admins (project:view); anyone's for admins
        own = json.loads(ok(xce(b, c.home, "acct", "--json")))
        assert own["user"] == BOB and [r["key"] for r in own["rows"]] == [BOB]
        refused(xce(b, c.home, "acct", "-u", "all"), f"{BOB} may not see the usage of everyone",
                f"xce acct -u {BOB}")
        refused(xce(b, c.home, "acct", "-P", "lab", "-u", ALICE), f"the admins of project lab ({CAROL})")
        by_user = json.loads(ok(xce(carol, c.home, "acct", "-P", "lab", "--json")))
        assert {r["key"] for r in by_user["rows"]} == {ALICE, BOB}
        assert {r["key"] for r in json.loads(ok(xce(boss, c.home, "acct", "--json")))["rows"]} == {ALICE, BOB}
    finally:
        finish(c)


def test_on_a_plain_test_host_a_job_runs_as_its_submitter_across_a_restart_and_an_admins_requeue(
        users, work, plain_hosts):
    """Faults in sequence: the controller killed (-9) while A's job runs on a plain host over SSH,
    started again, B refused all the same, an admin requeues the job: its second attempt runs as A
    too (never as the admin who requeued it), and ends DONE with A's files."""
    a, b, boss = users[ALICE], users[BOB], users[BOSS]
    a_dir = own_dir(work, a)
    c = start(remote_config(plain_hosts) + f"mode: shared\nadmins: [{BOSS}]\n")
    try:
        hosts_ok(c, "the plain host up")
        job = submit(a, c, a_dir, "--", "sh", "-c",
                     'echo "$(id -un) $(hostname) $XCE_ATTEMPT" >> ledger; '
                     'i=0; while [ ! -e go ] && [ $((i += 1)) -lt 600 ]; do sleep 0.1; done; test -e go')
        ledger = a_dir / "ledger"
        wait_until(lambda: ledger.exists() and ledger.read_text().strip(), 60, "the first attempt to start")
        c.kill9_controller()
        c.start()
        refused(xce(b, c.home, "kill", str(job)), f"{BOB} may not kill", f"its owner {ALICE}")
        ok(xce(boss, c.home, "requeue", str(job)))
        wait_until(lambda: len(ledger.read_text().splitlines()) == 2, 60, "the second attempt to start")
        (a_dir / "go").touch()
        assert c.wait_state(job, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
        host = plain_hosts[0].name
        assert ledger.read_text().splitlines() == [f"{ALICE} {host} 1", f"{ALICE} {host} 2"]
        for path in (ledger, a_dir / f"xce-{job}.out"):
            assert path.stat().st_uid == a.uid, f"{path} is not {ALICE}'s"
    finally:
        finish(c)


def test_a_shared_homes_controller_refuses_to_start_as_anyone_but_root(users, work):
    b = users[BOB]
    home = own_dir(work, b) / "home"
    home.mkdir()
    (home / "xce.yaml").write_text(shared_config("  - {name: local, slots: 1, mem: 1G}\n"))
    os.chown(home, b.uid, b.gid)
    os.chown(home / "xce.yaml", b.uid, b.gid)
    refused(xce(b, home, "controller", "start"), "this home is shared", "its controller runs as root",
            "sudo xce controller start")


def test_profile_hooks_run_as_the_user_but_one_marked_as_root_and_the_jobs_own_hook_as_the_user(users, work):
    a = users[ALICE]
    a_dir = own_dir(work, a)
    log = a_dir / "hooks.log"
    record = f'echo "$0 $(id -un)" >> {log}'
    c = start(shared_config("  - {name: local, slots: 1, mem: 1G}\n"), f"""\
applications:
  clean:
    hooks:
      pre_job_exec: [/bin/sh, -c, '{record}', profile-pre]
      post_job_exec: {{argv: [/bin/sh, -c, '{record}', profile-post-root], as: root}}
""")
    try:
        job = submit(a, c, a_dir, "-app", "clean", "-E", f"sh -c '{record}' job-pre", "--", "true")
        assert c.wait_state(job, {"DONE", "EXIT"})["state"] == "DONE"
        assert log.read_text().splitlines() == [f"profile-pre {ALICE}", f"job-pre {ALICE}", "profile-post-root root"]
    finally:
        finish(c)
