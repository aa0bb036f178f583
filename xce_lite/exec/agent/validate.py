"""What the agent takes: unit names, paths and the specs of launch and tasks requests. Refused is
a request this host cannot serve, with what to fix; nothing here changes anything."""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import TypeGuard

import os

from .hooks import HOOK_POINTS
from .util import LETTERS_DIGITS

UNIT_FIRST_CHARS = frozenset(LETTERS_DIGITS + "_@+")
UNIT_CHARS = UNIT_FIRST_CHARS | frozenset(".:=-")
SYSTEMD_UNIT_CHARS = frozenset(LETTERS_DIGITS + "_.:-")  # what systemd allows, less '@' and '\'
ENV_NAME_CHARS = frozenset(LETTERS_DIGITS + "_")  # what systemd 252 takes in Environment= names
# Nothing systemd splits, unquotes or expands ($VAR, %i, quotes, \, spaces) in a unit's command line.
SYSTEMD_PATH_CHARS = frozenset(LETTERS_DIGITS + "/_.,:+=@-")


def valid_unit_name(name: object) -> TypeGuard[str]:
    return (
        isinstance(name, str) and 0 < len(name) <= 200 and name[0] in UNIT_FIRST_CHARS and set(name) <= UNIT_CHARS
    )


def dbus_text_ok(text: str) -> bool:
    """True if systemd takes `text` as a D-Bus string: UTF-8 (no lone surrogate, which is how a raw
    byte from os.environ looks), without the noncharacters its UTF-8 check refuses."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(0xFDD0 <= ord(c) <= 0xFDEF or (ord(c) & 0xFFFE) == 0xFFFE for c in text)


def normal_path(path: str) -> bool:
    """True for an absolute path systemd calls normalized: no '//', '/./', '/../', trailing '/'."""
    return (path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path
            and len(path) < 4096 and all(len(part) < 256 for part in path.split("/")))


class Refused(Exception):
    """A request this host cannot serve; the message says what to fix."""


def check_argv_env(argv: object, env: object, allow_empty: bool = False) -> None:
    """Raise Refused unless argv is a list of strings (non-empty unless allowed) and env maps
    strings to strings, with no NUL anywhere and env names non-empty without '='."""
    if not isinstance(argv, list) or not (argv or allow_empty) or not all(isinstance(a, str) for a in argv):
        raise Refused("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise Refused("env must map strings to strings")
    if any("\0" in a for a in argv) or any("\0" in k + v or "=" in k or not k for k, v in env.items()):
        raise Refused("argv and env cannot hold NUL bytes, and env names must be non-empty without '='")


def check_cwd(cwd: object) -> None:
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
        raise Refused(f"cwd {cwd!r} is not an existing directory (give an absolute path)")
    if not os.access(cwd, os.X_OK):
        raise Refused(f"cwd {cwd} is not accessible: fix its permissions")


def validate(u: dict, mode: str = "plain") -> None:
    """Raise Refused unless `u` is a unit spec this agent can launch in `mode`."""
    if not isinstance(u, dict):
        raise Refused(f"a unit must be an object, not {u!r}")
    unit = u.get("unit")
    if not valid_unit_name(unit):
        raise Refused(f"bad unit name {unit!r}: use letters, digits and _.@:+=- (not starting with .)")
    if mode != "plain" and (not set(unit) <= SYSTEMD_UNIT_CHARS or len(unit) > 240):
        raise Refused(f"unit name {unit!r} cannot name a systemd unit: use letters, digits and _.:- only")
    role = u.get("role", "job")
    if role not in ("job", "host"):
        raise Refused(f"role {role!r} is neither 'job' (runs argv) nor 'host' (holds the allocation, runs tasks)")
    check_argv_env(u.get("argv"), u.get("env"), allow_empty=role == "host")
    check_cwd(u.get("cwd"))
    for key in ("stdout", "stderr"):
        path = u.get(key)
        if not (isinstance(path, str) and os.path.isabs(path)) and not (key == "stderr" and path is None):
            raise Refused(f"{key} must be an absolute path{' or null' if key == 'stderr' else ''}")
    for key in ("run_limit", "mem_limit", "grace"):
        value = u.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
            raise Refused(f"{key} must be a non-negative number or null")
    umask = u.get("umask")
    if umask is not None and (not isinstance(umask, int) or isinstance(umask, bool) or not 0 <= umask <= 0o777):
        raise Refused("umask must be a number from 0 to 0o777 (511), or null")
    hostfile = u.get("hostfile")
    if hostfile is not None and (not isinstance(hostfile, str) or "\0" in hostfile):
        raise Refused("hostfile must be text (the lines of the job's hostfile) or null")
    validate_hooks(u)
    validate_user(u.get("user"))


def validate_user(user: object) -> None:
    """The job's user (shared mode): null (the agent's own user), or {name, uid, gid (null: the
    passwd entry's), groups (supplementary gids; null: the host's for that user)}."""
    if user is None:
        return

    def count(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32

    if not isinstance(user, dict) or not isinstance(user.get("name"), str) or not user["name"] or set(
            user["name"]) & set("/:\0\n") or not count(user.get("uid")):
        raise Refused(f"user must be {{name, uid, gid, groups}} (a user name and numbers), not {user!r}")
    if user.get("gid") is not None and not count(user["gid"]):
        raise Refused(f"user {user['name']}: gid must be a number or null")
    groups = user.get("groups")
    if groups is not None and (not isinstance(groups, list) or not all(count(g) for g in groups)):
        raise Refused(f"user {user['name']}: groups must be a list of numbers (supplementary gids) or null")


def validate_hooks(u: dict) -> None:
    hooks = u.get("hooks") or []
    if not isinstance(hooks, list):
        raise Refused("hooks must be a list of {point, layer, argv, timeout}")
    for hook in hooks:
        if not isinstance(hook, dict) or hook.get("point") not in HOOK_POINTS or hook.get("layer") not in (
                "profile", "job"):
            raise Refused(f"a hook needs a point ({', '.join(HOOK_POINTS)}) and a layer (profile or job): {hook!r}")
        check_argv_env(hook.get("argv"), {})
        if hook.get("as") not in (None, "user", "root"):
            raise Refused(f"hook {hook['point']}: as is user (the job's user, the default) or root, not {hook['as']!r}")
        timeout = hook.get("timeout")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < 1e7:
            raise Refused(f"hook {hook['point']}: timeout must be a positive number of seconds")
    check_argv_env(u.get("starter") or [], u.get("profile_env") or {}, allow_empty=True)
    if u.get("post_failure") not in (None, "record", "exit"):
        raise Refused("post_failure is record or exit")


def validate_tasks(req: dict) -> None:
    if not valid_unit_name(req.get("unit")) or not valid_unit_name(req.get("launch_id")):
        raise Refused(f"bad unit {req.get('unit')!r} or launch_id {req.get('launch_id')!r}")
    tasks = req.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise Refused("tasks must be a non-empty list of {index, argv, env, cwd}")
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("index"), int) or isinstance(task["index"], bool):
            raise Refused(f"each task needs an integer index: {task!r}")
        check_argv_env(task.get("argv"), task.get("env"))
        check_cwd(task.get("cwd"))
