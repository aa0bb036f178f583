"""Presets: named sets of `xce submit` options, kept by the client and expanded there.

A preset is a convenience default, never a rule (rules are application profiles): an option given on
the command line wins over the preset's; `--env` and `--app-param` are merged by name, the command
line's on top; `-R` given on the command line replaces the preset's `-R` list. The server never
interprets a preset: submit records its name, content hash and the spec fields it set in the job's
`exdata.meta.preset`, which the controller passes through and the agent ignores.

One JSON file per preset, `<dir>/<name>.json` (JSON, not YAML: `xce submit --preset` must stay cheap):

    {"schema": 1, "name": "sweep", "description": "4 to 8 tasks, 2G each",
     "options": {"tasks": "4,8", "resreq": ["rusage[mem=2G]"], "run_limit": "30m", "queue": "short"},
     "origin": {"cluster": "lab", "name": "sweep", "hash": "..."}}       # only when pulled

`options` keys are the submit option names in OPTIONS, values as typed on the command line
(`run_limit: "30m"`), so one set of parsers checks both. `origin` says which server preset a local
one was pulled from: `xce preset pull` refuses to overwrite a local preset of the same name unless
it came from that same server preset (or `--force`, which keeps the old file as `<name>.json.bak`).

Local presets live in `$XDG_CONFIG_HOME/xce/presets` (default `~/.config/xce/presets`); submit uses
these only. Admin presets live in `<home>/config/presets/`, are re-read when a file changes
(`PresetDir`), and are shared read-only at `/xce/v1/presets`. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xce_lite.errors import NotFound, SpecError

SCHEMA = 1
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
MAX_BYTES = 64 * 1024
# option -> (its flag on the command line, the JSON type of its value)
OPTIONS: dict[str, tuple[str, type]] = {
    "name": ("-J", str), "queue": ("-q", str), "project": ("-P", str), "app": ("-app", str), "tasks": ("-n", str),
    "resreq": ("-R", list), "gpus": ("--gpus", int), "stdout": ("-o", str), "stderr": ("-e", str),
    "cwd": ("--cwd", str), "env": ("--env", list), "env_none": ("--env-none", bool),
    "run_limit": ("-W", str), "mem_limit": ("-M", str), "priority": ("-sp", int), "hold": ("--hold", bool),
    "app_param": ("--app-param", list), "depend": ("-w", str), "on_dep_fail": ("--on-dep-fail", str),
    "retry": ("--retry", int), "retry_on": ("--retry-on", str),
    "pre_exec": ("-E", str), "post_exec": ("-Ep", str),
}


@dataclass(frozen=True)
class Preset:
    name: str
    options: dict[str, Any]
    description: str = ""
    origin: dict[str, str] | None = None  # {"cluster", "name", "hash"} of the server preset it was pulled from

    @property
    def hash(self) -> str:
        """Content hash of the options (what a job got from it); the description is left out."""
        text = json.dumps(self.options, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": SCHEMA, "name": self.name, "description": self.description,
                               "options": self.options}
        if self.origin is not None:
            doc["origin"] = self.origin
        return doc

    def renamed(self, name: str, origin: dict[str, str] | None = None) -> Preset:
        check_name(name)
        return Preset(name, self.options, self.description, origin)


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise SpecError(f"preset name {name!r}: use 1 to 63 letters, digits, _ . - (starting with a letter or digit)")
    return name


def parse_json(raw: bytes, where: str) -> Any:
    """A preset file's JSON; SpecError names `where` when it is not UTF-8, not JSON, or an object
    holds a key twice (json keeps the last one without a word: an option silently dropped)."""
    def no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen = set()
        for key, _value in pairs:
            if key in seen:
                raise SpecError(f"{where}: key {key!r} appears twice in the same object; JSON would keep only "
                                "the last one and silently drop the first: keep one")
            seen.add(key)
        return dict(pairs)

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = raw.count(b"\n", 0, err.start) + 1, err.start - raw.rfind(b"\n", 0, err.start)
        raise SpecError(f"{where}: not UTF-8 text (line {line}, column {column}: {err.reason}); save it as "
                        "UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=no_twice)
    except ValueError as err:
        raise SpecError(f"{where} is not valid JSON: {err}") from None


def from_json(doc: Any, where: str) -> Preset:
    """A preset document checked field by field; SpecError names `where` and the field."""
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: a preset is a JSON object with name and options")
    unknown = sorted(set(doc) - {"schema", "name", "description", "options", "origin"})
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(unknown)}")
    if doc.get("schema", SCHEMA) != SCHEMA:
        raise SpecError(f"{where}: schema {doc.get('schema')!r} is not {SCHEMA}; upgrade xce_lite")
    name, description, options = doc.get("name"), doc.get("description", ""), doc.get("options")
    if not isinstance(name, str):
        raise SpecError(f"{where}: name must be text")
    check_name(name)
    if not isinstance(description, str):
        raise SpecError(f"{where}: description must be text")
    if not isinstance(options, dict):
        raise SpecError(f"{where}: options must be an object of submit options")
    for key, value in options.items():
        if key not in OPTIONS:
            raise SpecError(f"{where}: options.{key} is not a submit option; known: {', '.join(OPTIONS)}")
        kind = OPTIONS[key][1]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if ok and kind is list:
            ok = all(isinstance(v, str) for v in value)
        if not ok:
            raise SpecError(f"{where}: options.{key} must be {'a list of texts' if kind is list else kind.__name__}")
    origin = doc.get("origin")
    if origin is not None and not (isinstance(origin, dict) and all(isinstance(v, str) for v in origin.values())):
        raise SpecError(f"{where}: origin must be an object of texts")
    return Preset(name, dict(options), description, origin)


def read_file(path: Path) -> Preset:
    """SpecError names the file when it is not a valid preset."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"no preset {path.stem} (no {path}); see `xce preset list`") from None
    except OSError as err:
        raise SpecError(f"cannot read {path}: {err.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise SpecError(f"{path} is above {MAX_BYTES} bytes; a preset holds submit options only")
    preset = from_json(parse_json(raw, str(path)), str(path))
    if preset.name != path.stem:
        raise SpecError(f"{path} holds preset {preset.name!r}; the file name must be {preset.name}.json")
    return preset


def local_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "xce" / "presets"


def load(name: str, directory: Path | None = None) -> Preset:
    return read_file((directory or local_dir()) / f"{check_name(name)}.json")


def list_dir(directory: Path | None = None) -> tuple[list[Preset], list[str]]:
    """(valid presets by name, problems with the files that are not)."""
    directory = directory or local_dir()
    presets, problems = [], []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            presets.append(read_file(path))
        except (SpecError, NotFound) as err:
            problems.append(str(err))
    return presets, problems


def save(preset: Preset, directory: Path | None = None, replace: bool = False, backup: bool = False) -> Path:
    """Write `preset` atomically. An existing file is refused unless `replace`; `backup` keeps it
    as `<name>.json.bak` first. 0600 (its folder, if made here, 0700): a preset may hold --env
    values, secrets among them; admin presets reach users through the controller, not the file."""
    directory = directory or local_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{check_name(preset.name)}.json"
    if path.exists():
        if not replace:
            raise SpecError(f"a preset {preset.name} exists already ({path}); use --force to replace it "
                            f"(the old one is kept as {path.name}.bak), or choose another name")
        if backup:
            os.replace(path, path.with_name(path.name + ".bak"))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(preset.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def remove(name: str, directory: Path | None = None) -> Path:
    path = (directory or local_dir()) / f"{check_name(name)}.json"
    try:
        path.unlink()
    except FileNotFoundError:
        raise NotFound(f"no preset {name} (no {path}); see `xce preset list`") from None
    return path


def pull_target(server: Preset, cluster: str, local: Preset | None, force: bool) -> tuple[dict[str, str], bool]:
    """(origin to record, whether to keep a .bak) for pulling `server` over `local` (None: no such
    local preset). SpecError when the names collide and neither rule allows it."""
    origin = {"cluster": cluster, "name": server.name, "hash": server.hash}
    if local is None:
        return origin, False
    same = local.origin is not None and (local.origin.get("cluster"), local.origin.get("name")) == (cluster,
                                                                                                server.name)
    if same:
        return origin, False  # an update of the very preset it was pulled from
    if force:
        return origin, True
    raise SpecError(f"a local preset {local.name} exists and was not pulled from {cluster}'s {server.name}; "
                    f"pull it under another name with --as NEW, or replace it with --force "
                    f"(the old one is kept as {local.name}.json.bak)")


class PresetDir:
    """A directory of admin presets, re-read when a file changes (by mtime and size), for the API."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._seen: dict[str, tuple[tuple[int, int], Preset | str]] = {}

    def read(self) -> tuple[list[Preset], list[str]]:
        """(valid presets, problems with the others), as the files are now."""
        presets, problems, seen = [], [], {}
        paths = sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []
        for path in paths:
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._seen.get(path.name)
            if cached is None or cached[0] != key:
                try:
                    cached = (key, read_file(path))
                except (SpecError, NotFound) as err:
                    cached = (key, str(err))
            seen[path.name] = cached
            if isinstance(cached[1], Preset):
                presets.append(cached[1])
            else:
                problems.append(cached[1])
        self._seen = seen
        return presets, problems
