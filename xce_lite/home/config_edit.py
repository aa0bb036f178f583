"""Edits of a cluster home's files that keep what the user wrote: hosts in `xce.yaml`, and known_hosts.

`xce.yaml` is edited as text, never re-dumped: PyYAML's compose gives each node's position, and a
host is added as new lines after the last one of the `hosts:` list (block style, in the layout of the
list's last item) or as `, {...}` after its last item (flow style); a removed host takes its own lines
(or its item and one comma) with it. Comments, order, quoting and blank lines elsewhere stay byte
for byte.

Invariants, for every edit:
- it is checked before it is kept: the edited text must parse to exactly the old data with the
  hosts list changed as asked (so a layout misread cannot change anything else), and must load with
  `config.load_config`; otherwise ConfigError says why and the file is left byte-identical;
- it is atomic: a temp file beside the original (same mode), fsynced, renamed over it, the directory
  fsynced; readers see the old file or the new one, never half of one;
- editors are serialised by an flock on the file's directory, so two edits never lose one another.

known_hosts lines are `HOSTS KEYTYPE BASE64` (OpenSSH; HOSTS is `addr` for port 22, else
`[addr]:port`, comma-separated). Adding never duplicates a line, and refuses a different key of the
same type for a host already listed unless told it replaces a stale one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from xce_lite.config import yamlfile
from xce_lite.config.cluster import load_config
from xce_lite.errors import ConfigError

_INF = float("inf")


# ---- xce.yaml: hosts ------------------------------------------------------------------------------


def add_host(path: Path, entry: dict[str, Any], comment: str | None = None) -> None:
    """Add one host (a mapping as it would appear in the file) to the `hosts:` list of `path`."""
    add_hosts(path, [entry], comment)


def add_hosts(path: Path, entries: list[dict[str, Any]], comment: str | None = None) -> None:
    """Add these hosts, in order, in ONE atomic edit; `comment` goes at the end of each new item's
    first line (block lists only: a flow list stays on its lines).

    ConfigError, with the file unchanged: a name already in the file (or twice in `entries`), no
    `hosts:` list, or a result that would not load.
    """
    if not entries:
        return
    with _locked(path):
        text, root, data = _read(path)
        seq = _hosts_node(root)
        have = _names(data)
        for entry in entries:
            name = entry.get("name")
            if name in have[:len(seq.value)]:
                line = seq.value[have.index(name)].start_mark.line + 1
                raise ConfigError(f"{path} already has a host named {name!r} (line {line}); choose another "
                                  f"name, or remove that host first")
            if name in have:
                raise ConfigError(f"host {name!r} is given twice; give each new host its own name")
            have.append(name)
        new = _insert_hosts(text, seq, entries, comment)
        expected = dict(data, hosts=[*data["hosts"], *entries])
        _check_and_replace(path, new, expected, f"adding host(s) {', '.join(str(e.get('name')) for e in entries)}")


def remove_hosts(path: Path, names: Iterable[str]) -> list[str]:
    """Remove the hosts with these names from `path` in one atomic edit; return those it removed
    (names not in the file are no error). ConfigError, with the file unchanged, when the result
    would not load (e.g. no host left)."""
    wanted = set(names)
    with _locked(path):
        text, root, data = _read(path)
        seq = _hosts_node(root)
        present = _names(data)
        doomed = [i for i, name in enumerate(present) if name in wanted]
        if not doomed:
            return []
        new = _cut_items(text, seq, doomed)
        expected = dict(data, hosts=[h for i, h in enumerate(data["hosts"]) if i not in doomed])
        removed = [present[i] for i in doomed]
        _check_and_replace(path, new, expected, f"removing host(s) {', '.join(removed)}")
        return removed


def _read(path: Path) -> tuple[str, yaml.MappingNode, dict]:
    """The file's text, node tree and data; ConfigError (load_config's) unless it is a valid config now."""
    load_config(path)  # an edit starts from a file that loads: its errors say what to fix first
    text = path.read_text(encoding="utf-8")
    data, root = yamlfile.parse(text, str(path), exact_marks=True)
    assert isinstance(root, yaml.MappingNode)  # load_config() found a mapping there
    return text, root, data


def _hosts_node(root: yaml.MappingNode) -> yaml.SequenceNode:
    """The `hosts:` list (a valid config has one, with at least one host)."""
    return next(value for key, value in root.value if key.value == "hosts")


def _names(data: dict) -> list:
    return [h.get("name") if isinstance(h, dict) else None for h in data.get("hosts") or []]


def _content_end(node: yaml.Node) -> int:
    """Index just past the node's own text. A block collection's end mark lies past the comments and
    blank lines after it (where the next token starts), so take its last leaf's end instead."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(node, yaml.MappingNode) else last
    return node.end_mark.index


def _line_after(text: str, index: int) -> int:
    """The start of the line after the one `index` is on (a trailing comment stays with its line)."""
    if index > 0 and text[index - 1] == "\n":  # a block scalar (`|`) ends after its newline
        return index
    newline = text.find("\n", index)
    return len(text) if newline < 0 else newline + 1


def _dash(text: str, item: yaml.Node) -> int:
    """Index of the `-` that introduces a block list's item."""
    i = item.start_mark.index - 1
    while i >= 0 and text[i] in " \t\r\n":
        i -= 1
    if i < 0 or text[i] != "-":
        raise ConfigError("internal: a block list item without its '-'")  # compose guarantees one
    return i


def _insert_hosts(text: str, seq: yaml.SequenceNode, entries: list[dict], comment: str | None) -> str:
    if seq.flow_style:
        flows = [_flow(e) for e in entries]
        if seq.value:
            at = seq.value[-1].end_mark.index
            return text[:at] + "".join(", " + f for f in flows) + text[at:]
        at = seq.start_mark.index + 1  # just inside `[`
        return text[:at] + ", ".join(flows) + text[at:]
    last = seq.value[-1]
    indent = " " * seq.start_mark.column
    as_flow = isinstance(last, yaml.MappingNode) and last.flow_style
    suffix = f"  # {comment}" if comment else ""
    lines = []
    for entry in entries:
        if as_flow:
            item = [f"- {_flow(entry)}"]
        else:
            item = _dump([entry], flow=None).splitlines()
        item[0] += suffix
        lines += [indent + line for line in item]
    at = _line_after(text, _content_end(last))
    before = text[:at] if at == 0 or text[at - 1] == "\n" else text[:at] + "\n"
    return before + "\n".join(lines) + "\n" + text[at:]


def _flow(entry: dict) -> str:
    return _dump(entry, flow=True).strip()


def _dump(value: Any, flow: bool | None) -> str:
    try:
        return yaml.safe_dump(value, default_flow_style=flow, sort_keys=False, width=_INF)
    except yaml.YAMLError as err:
        raise ConfigError(f"a host entry takes only strings, numbers, lists and mappings ({err})") from None


def _cut_items(text: str, seq: yaml.SequenceNode, doomed: list[int]) -> str:
    spans: list[tuple[int, int]] = []
    items = seq.value
    if seq.flow_style:
        # Runs of adjacent removed items go with the comma after them, or the last run with the one before.
        runs: list[list[int]] = []
        for i in doomed:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            first, last = run[0], run[-1]
            if last + 1 < len(items):
                spans.append((items[first].start_mark.index, items[last + 1].start_mark.index))
            elif first > 0:
                spans.append((items[first - 1].end_mark.index, items[last].end_mark.index))
            else:
                spans.append((items[first].start_mark.index, items[last].end_mark.index))
    else:
        for i in doomed:
            dash = _dash(text, items[i])
            spans.append((text.rfind("\n", 0, dash) + 1, _line_after(text, _content_end(items[i]))))
    for start, end in sorted(spans, reverse=True):
        text = text[:start] + text[end:]
    return text


def _check_and_replace(path: Path, new: str, expected: dict, what: str) -> None:
    """Keep `new` as `path` only if it parses to `expected` and loads as a cluster config."""
    try:
        parsed = yamlfile.parse(new, str(path), exact_marks=True)[0]
    except ConfigError as err:
        parsed = err
    if isinstance(parsed, dict) and expected.get("hosts") == [] and parsed.get("hosts") is None:
        parsed = dict(parsed, hosts=[])  # a block list without items reads as null; load_config says why
    if parsed != expected:  # a layout this module misread: refuse rather than change something else
        raise ConfigError(f"{what} in {path} would need a layout this editor cannot make safely; the file is "
                          f"unchanged: edit it by hand")
    tmp = _write_temp(path, new)
    try:
        try:
            load_config(tmp)
        except ConfigError as err:
            # load_config's closing advice ("fix the file") is wrong here: the file is fine, the request is not
            detail = str(err).replace(str(tmp), f"{path} (as edited)").rsplit("\nfix the file", 1)[0]
            raise ConfigError(f"{what} would make {path} invalid, so it is unchanged; change what was asked:\n"
                              f"{detail}") from None
        _commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---- known_hosts ------------------------------------------------------------------------------------


def known_hosts_line(address: str, port: int, key_type: str, key: str) -> str:
    """The OpenSSH known_hosts line for a host key: `addr` on port 22, else `[addr]:port`."""
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key_type} {key}"


def add_known_hosts(path: Path, lines: Iterable[str], replace: bool = False) -> list[str]:
    """Append these known_hosts lines to `path` (made 0600 if new); return those not there already.

    A host already listed with another key of the same type is refused (ConfigError: the key
    changed, which needs a human), unless `replace`: then those older lines go (for hosts the
    caller itself just made, such as the practice cluster's, whose keys are new each time).
    """
    parsed = [_fields(line) for line in lines]
    wanted = [f for f in parsed if f is not None]
    if len(wanted) != len(parsed):
        raise ConfigError("a known_hosts line needs HOSTS KEYTYPE KEY")
    with _locked(path):
        old = _read_lines(path)
        have = [_fields(line) for line in old]
        keep = []
        for line, fields in zip(old, have):
            clash = fields and next((w for w in wanted if _conflicts(fields, w)), None)
            if clash and not replace:
                raise ConfigError(f"{path} already has a different {clash[1]} key for {line.split()[0]}: if that "
                                  f"host was reinstalled, remove its old line from {path} and try again")
            if not clash:
                keep.append(line)
        added = [" ".join(w) for w in wanted if w not in have]
        if added or len(keep) != len(old):
            replace_file(path, "".join(line + "\n" for line in keep + added))
        return added


def remove_known_hosts(path: Path, lines: Iterable[str]) -> int:
    """Remove exactly these known_hosts lines (compared field by field) from `path`; return how many."""
    doomed = {_fields(line) for line in lines}
    with _locked(path):
        old = _read_lines(path)
        keep = [line for line in old if _fields(line) not in doomed]
        if len(keep) != len(old):
            replace_file(path, "".join(line + "\n" for line in keep))
        return len(old) - len(keep)


def _fields(line: str) -> tuple[str, str, str] | None:
    parts = line.split()
    if len(parts) < 3 or parts[0].startswith(("#", "@")):
        return None
    return parts[0], parts[1], parts[2]


def _conflicts(have: tuple[str, str, str], want: tuple[str, str, str]) -> bool:
    return have[1] == want[1] and have[2] != want[2] and bool(set(have[0].split(",")) & set(want[0].split(",")))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None


# ---- atomic replacement --------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on the file's directory (the file itself is replaced, so cannot carry one)."""
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise ConfigError(f"cannot open the directory of {path}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_temp(path: Path, text: str) -> Path:
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.write(fd, text.encode("utf-8"))
            os.fchmod(fd, mode)  # the umask may have narrowed it
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {tmp}: {err.strerror}; {path} is unchanged") from None
    return tmp


def _commit(tmp: Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)
    except OSError as err:
        raise ConfigError(f"cannot replace {path}: {err.strerror}") from None


def replace_file(path: Path, text: str) -> None:
    """Make `text` the content of `path` atomically and durably (temp file, fsync, rename, fsync dir)."""
    tmp = _write_temp(path, text)
    try:
        _commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
