"""controller/projects.py: a caller's groups (its effective gid from SO_PEERCRED, then its process's
supplementary groups), and a user's from the group database when the user is not the caller."""

from __future__ import annotations

import grp
import os
import subprocess
import sys

from xce_lite.api.caller import Caller
from xce_lite.controller.projects import caller_groups, user_groups


def test_the_callers_groups_come_from_its_process_its_effective_group_first():
    me = Caller(uid=os.geteuid(), pid=os.getpid(), user="someone", gid=os.getegid())
    names = caller_groups(me)
    assert names[0] == grp.getgrgid(os.getegid()).gr_name
    assert set(names) >= {grp.getgrgid(g).gr_name for g in os.getgroups()}


def test_a_caller_gone_falls_back_to_the_group_database():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid names no process now: /proc/PID/status is gone
    gone = Caller(uid=0, pid=child.pid, user="root", gid=0)
    assert caller_groups(gone)[0] == "root" and "root" in user_groups("root")
    assert user_groups("no-such-user-here") == ()
