"""A shared controller's check, at submit, that the submitter may use a job's directories.

The controller runs as root, so its own access() says nothing about the user. The check runs in a
short-lived child process with the user's uid, gid and groups (subprocess's user=/group=/
extra_groups=, set between fork and exec), which asks coreutils' `test` (faccessat: modes, ACLs,
and whatever the file system says, NFS root squash included). Not seteuid in the controller:
that would change the credentials of every thread of it at once. Costs one fork+exec of `test`
(bench/shared_submit.py); shared.py keeps a passed check for a few seconds, so a flow's steps or
an array in the same directories pay it once.

Needs: the working directory readable and searchable; the directory of each output file (the
working directory for the default one) writable and searchable.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from xce_lite import errors
from xce_lite.models import JobSpec

def output_dirs(spec: JobSpec) -> list[str]:
    """The directories the job's output files are made in (the cwd for the default one)."""
    dirs = []
    for path in (spec.stdout, spec.stderr):
        if path is not None:
            dirs.append(os.path.dirname(path) or "/")
    if spec.stdout is None:
        dirs.append(spec.cwd)
    return list(dict.fromkeys(dirs))


def check_paths(spec: JobSpec, user: str, uid: int, gid: int, groups: tuple[int, ...]) -> None:
    """SpecError naming the path and the user if `user` may not use the job's directories. One
    `test` of them all; only when it fails, one per directory, to name the one at fault."""
    needs: list[tuple[str, tuple[str, ...]]] = [(spec.cwd, ("-r", "-x"))]
    needs += [(d, ("-w", "-x")) for d in output_dirs(spec)]
    if _test(_expression(needs), uid, gid, groups, user):
        return
    for (path, modes), what in zip(needs, ["cwd"] + ["out"] * (len(needs) - 1)):
        if _test(_expression([(path, modes)]), uid, gid, groups, user):
            continue
        if what == "cwd":
            raise errors.SpecError(f"working directory {path}: user {user} cannot read and enter it (checked with "
                                   f"{user}'s own permissions); submit from a directory of yours")
        raise errors.SpecError(f"output directory {path}: user {user} cannot write there (checked with "
                               f"{user}'s own permissions); choose another with -o/-e, or submit from a "
                               f"directory of yours")
    raise errors.SpecError(f"the job's directories changed while they were checked as user {user}; submit again")


def _expression(needs: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    words: list[str] = []
    for path, modes in needs:
        for flag in ("-d", *modes):
            words += [*(["-a"] if words else []), flag, path]
    return words


def _test(expression: list[str], uid: int, gid: int, groups: tuple[int, ...], user: str) -> bool:
    test = shutil.which("test", path="/usr/bin:/bin") or "/usr/bin/test"
    try:
        done = subprocess.run([test, *expression], user=uid, group=gid, extra_groups=list(groups),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10, cwd="/", env={})
    except (OSError, subprocess.SubprocessError) as err:
        raise errors.SpecError(f"could not check the job's directories as user {user}: {err}") from None
    return done.returncode == 0
