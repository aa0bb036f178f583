"""The set-up side of a shared lab (issue 16): which home a command uses (--home, XCE_HOME, a personal
~/.xce, the machine's registered default), `xce init --shared` (modes, settings, refusals that leave
nothing behind, registering the default) and `xce controller unit` (systemd accepts the unit).

Real files and the real CLI (`python -m xce_lite`); the machine's default file is redirected with
XCE_DEFAULT_HOME_FILE, so /etc is never touched. Shared homes live under /var/lib/xce-tests (0711):
a home under the usual test directory (in /root) could not be reached by other users, and init
refuses such a place.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.localusers import shared_dir, xce_as
from xce_lite.config.cluster import load_config
from xce_lite.home.paths import Home, resolve_home
from xce_lite.testhosts import LocalUser

@pytest.fixture
def base():
    """A directory others may pass through (0711), with its own HOME, state dir and default file."""
    with shared_dir("shared-home-") as path:
        (path / "me").mkdir()
        yield path


def env_for(base: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("XCE_", "XDG_", "SUDO_"))}
    return {**keep, "HOME": str(base / "me"), "XDG_STATE_HOME": str(base / "state"),
            "XCE_DEFAULT_HOME_FILE": str(base / "etc" / "home"), **extra}


def xce(base: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xce_lite", *args], env=env_for(base, **extra),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- which home ----------------------------------------------------------------------------------


def test_the_home_is_the_option_then_the_env_then_a_personal_one_then_the_machines_default(base, monkeypatch):
    for key in ("XCE_HOME", "XCE_DEFAULT_HOME_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(base / "me"))
    personal = base / "me" / ".xce"
    monkeypatch.setenv("XCE_DEFAULT_HOME_FILE", str(base / "etc" / "home"))
    assert resolve_home() == Home(personal) and resolve_home().via == "personal"  # no default registered
    (base / "etc").mkdir()
    (base / "etc" / "home").write_text(f"{base / 'lab'}\n")
    assert resolve_home() == Home(base / "lab") and resolve_home().via == "machine"
    assert resolve_home().personal() == Home(personal)  # where `xce init` would make the user's own
    personal.mkdir()
    (personal / "xce.yaml").write_text("cluster: mine\n")
    assert resolve_home() == Home(personal)  # a cluster of one's own wins over the machine's
    monkeypatch.setenv("XCE_HOME", str(base / "env"))
    assert resolve_home() == Home(base / "env")
    assert resolve_home(str(base / "opt")) == Home(base / "opt")
    monkeypatch.delenv("XCE_HOME")
    shutil.rmtree(personal)
    for junk in ("", "relative/path\n", "\n\n"):  # an unusable file is as if there were none
        (base / "etc" / "home").write_text(junk)
        assert resolve_home() == Home(personal)


def test_a_shared_home_is_open_to_pass_through_and_its_spool_stays_private(base):
    home = Home(base / "h")
    home.make_private()
    assert mode(home.root) == 0o700
    home.config.write_text("mode: shared\ncluster: x\n")
    home.spool.mkdir(mode=0o755)
    home.make_private()
    assert (mode(home.root), mode(home.spool)) == (0o711, 0o700)
    home.config.write_text("cluster: x\n")  # back to personal: closed again
    home.make_private()
    assert mode(home.root) == 0o700


# ---- xce init --shared ---------------------------------------------------------------------------


def test_init_shared_writes_a_lab_home_root_owns_and_users_reach(base):
    home = base / "lab"
    done = xce(base, "init", "--shared", str(home), "--admin", "root", "--admin", "@root", "--socket-group", "root",
               "--visibility", "summary")
    assert done.returncode == 0, done.stderr
    assert "shared" in done.stdout and f"XCE_HOME={home}" in done.stdout and "controller unit" in done.stdout
    config = load_config(home / "xce.yaml")
    assert (config.mode, config.admins, config.socket_group, config.visibility) == \
        ("shared", ["root", "@root"], "root", "summary")
    assert (mode(home), mode(home / "xce.yaml")) == (0o711, 0o644)
    assert (home.stat().st_uid, (home / "xce.yaml").stat().st_uid) == (0, 0)
    assert sorted(p.name for p in home.iterdir()) == ["xce.yaml"]
    assert not (base / "etc" / "home").exists()  # not registered unless asked


def test_init_shared_registers_the_machines_default_and_a_lab_user_lands_there(base):
    home = base / "lab"
    done = xce(base, "init", "--shared", str(home), "--register", "--admin", "root")
    assert done.returncode == 0, done.stderr
    default = base / "etc" / "home"
    assert default.read_text() == f"{home}\n" and mode(default) == 0o644 and mode(default.parent) == 0o755
    # with no home named, commands use it; `xce init` makes a user's own cluster in ~/.xce all the same
    where = xce(base, "controller", "status")
    assert str(home) in where.stderr, where.stderr
    mine = xce(base, "init")
    assert mine.returncode == 0 and str(base / "me" / ".xce" / "xce.yaml") in mine.stdout, mine.stderr
    assert load_config(base / "me" / ".xce" / "xce.yaml").mode == "personal"
    # another shared home may not take the default while the first holds a cluster
    again = xce(base, "init", "--shared", str(base / "lab2"), "--register", "--admin", "root")
    assert again.returncode != 0 and str(default) in again.stderr and "remove that file" in again.stderr
    assert not (base / "lab2").exists() and default.read_text() == f"{home}\n"


def test_the_default_admin_is_the_user_who_ran_sudo(base):
    done = xce(base, "init", "--shared", str(base / "lab"), SUDO_USER="nobody")
    assert done.returncode == 0, done.stderr
    assert load_config(base / "lab" / "xce.yaml").admins == ["nobody"]


@pytest.mark.parametrize(("args", "says"), [
    ([], "--admin NAME"),  # root, no sudo, no terminal: it must be told
    (["--admin", "no-such-user-xce"], "no user 'no-such-user-xce'"),
    (["--admin", "@no-such-group-xce"], "no group 'no-such-group-xce'"),
    (["--admin", "root", "--socket-group", "no-such-group-xce"], "groupadd no-such-group-xce"),
], ids=["no-admin", "unknown-user", "unknown-group", "unknown-socket-group"])
def test_init_shared_refuses_what_it_cannot_serve_and_writes_nothing(base, args, says):
    done = xce(base, "init", "--shared", str(base / "lab"), *args)
    assert done.returncode != 0 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (base / "lab").exists()


def test_init_shared_refuses_a_home_users_could_not_reach(base):
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    done = xce(base, "init", "--shared", str(closed / "lab"), "--admin", "root")
    assert done.returncode != 0 and f"{closed} lets only its owner in" in done.stderr, done.stderr
    assert not (closed / "lab").exists()


def test_init_shared_is_for_root_and_the_shared_options_for_shared_homes(base):
    nobody = LocalUser("nobody", 65534, 65534, base / "me")
    user = xce_as(nobody, ["init", "--shared", str(base / "lab"), "--admin", "nobody"], cwd=base)
    assert user.returncode != 0 and "sudo xce init --shared" in user.stderr, user.stderr
    personal = xce(base, "init", str(base / "p"), "--admin", "root", "--register")
    assert personal.returncode == 2 and "--admin, --register go with --shared" in personal.stderr
    assert not (base / "lab").exists() and not (base / "p").exists()


# ---- xce controller unit -------------------------------------------------------------------------


def test_the_controller_unit_is_accepted_by_systemd_and_runs_this_python_on_this_home(base, tmp_path):
    home = base / "my lab"  # a space: quoted on ExecStart
    assert xce(base, "init", "--shared", str(home), "--admin", "root").returncode == 0
    done = xce(base, "--home", str(home), "controller", "unit")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f'ExecStart={sys.executable} -m xce_lite --home "{home}" controller start --foreground' in text
    for line in ("Type=simple", "Restart=on-failure", "After=network-online.target", "WantedBy=multi-user.target",
                 "KillMode=process"):
        assert line in text.splitlines(), line
    assert "User=" not in text  # a shared home's controller runs as root
    unit = tmp_path / "xce-controller.service"
    unit.write_text(text)
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr


def test_the_unit_of_a_personal_home_runs_as_its_owner(base):
    home = base / "me" / ".xce"
    assert xce(base, "init").returncode == 0
    os.chown(home, 65534, 65534)
    text = xce(base, "controller", "unit").stdout
    assert "User=nobody" in text.splitlines() and f"--home {home} " in text


def test_controller_unit_without_a_home_says_how_to_make_one(base):
    done = xce(base, "--home", str(base / "none"), "controller", "unit")
    assert done.returncode != 0 and "xce init" in done.stderr and "Traceback" not in done.stderr


def test_a_shared_homes_lab_needs_root_agents(base, monkeypatch):
    from xce_lite.home import lab

    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    assert xce(base, "init", "--shared", str(base / "lab"), "--admin", "root").returncode == 0
    with pytest.raises(lab.LabError, match="sudo xce lab up"):
        lab.up(Home(base / "lab"), 2, unprivileged=True)
    assert not (base / "lab" / "lab.json").exists() and not (base / "lab" / "lab").exists()
