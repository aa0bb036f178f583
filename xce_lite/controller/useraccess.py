"""A shared controller's check, at submit, that the submitter may use a job's directories.

The controller runs as root, so its own access() says nothing about the user. The check runs in a
short-lived child process with the user's uid, gid and groups (subprocess's user=/group=/
extra_groups=, set between fork and exec), which asks coreutils' `test` (faccessat: modes, ACLs,
and whatever the file system says, NFS root squash included). Not seteuid in the controller:
that would change the credentials of every thread of it at once. Costs one fork+exec per submit
request (~1-2 ms), whatever the number of jobs in it.

Needs: the working directory readable and searchable; the directory of each output file (the
working directory for the default one) writable and searchable.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from xce_lite import errors
from xce_lite.models import JobSpec

# $1: the cwd; then each output directory. Prints the first that fails, with what it needs.
_SCRIPT = ('T="$1"; shift; C="$1"; shift; "$T" -d "$C" -a -r "$C" -a -x "$C" || { echo "cwd"; exit 3; }; '
           'for d; do "$T" -d "$d" -a -w "$d" -a -x "$d" || { echo "out $d"; exit 3; }; done')


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
    """SpecError naming the path and the user if `user` may not use the job's directories."""
    test = shutil.which("test", path="/usr/bin:/bin") or "/usr/bin/test"
    argv = ["/bin/sh", "-c", _SCRIPT, "sh", test, spec.cwd, *output_dirs(spec)]
    try:
        done = subprocess.run(argv, user=uid, group=gid, extra_groups=list(groups), capture_output=True,
                              text=True, errors="replace", timeout=10, cwd="/", env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as err:
        raise errors.SpecError(f"could not check the job's directories as user {user}: {err}") from None
    if done.returncode == 0:
        return
    said = done.stdout.strip()
    if said == "cwd":
        raise errors.SpecError(f"working directory {spec.cwd}: user {user} cannot read and enter it (checked with "
                               f"{user}'s own permissions); submit from a directory of yours")
    if said.startswith("out "):
        raise errors.SpecError(f"output directory {said[4:]}: user {user} cannot write there (checked with "
                               f"{user}'s own permissions); choose another with -o/-e, or submit from a "
                               f"directory of yours")
    raise errors.SpecError(f"could not check the job's directories as user {user}: {done.stderr.strip()}")
