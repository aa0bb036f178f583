"""The one way xce_lite reads YAML: xce.yaml, applications.yaml, flow files, workloads.

PyYAML alone raises UnicodeDecodeError on bytes that are not UTF-8 (an "internal error" to the
user) and keeps the LAST of two equal keys in a mapping without a word (two `controller:` blocks:
the first one silently dropped). Here, whatever the file:

- its text must be UTF-8: the error names the file, the line and the column;
- it must be valid YAML: the error names the file and PyYAML's place;
- no mapping may hold a key twice: the error names the file and both lines, for every such key.

The error is the caller's kind (ConfigError for the cluster's files, SpecError for a user's flow
or workload), so that the CLI exits 2 with the message. Returns the data and the node tree, for the
lines of later checks (yamlmodel.problem). `where` is how the file is named in messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from xce_lite.errors import ConfigError, XceError

MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *anchor`, which may repeat
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when there: the same documents, faster


def decode(raw: bytes, where: str, error: type[XceError] = ConfigError) -> str:
    """`raw` as UTF-8 text; `error` naming the line and column of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - raw.rfind(b"\n", 0, err.start)  # 1-based, in bytes
        raise error(f"{where}: not UTF-8 text (line {line}, column {column}: {err.reason}); save it as "
                    "UTF-8") from None


def parse(text: str, where: str, error: type[XceError] = ConfigError,
          exact_marks: bool = False) -> tuple[Any, yaml.Node | None]:
    """The YAML document in `text`: (its data, its node tree); `error` if it is not valid YAML or a
    mapping holds a key twice. The tree is composed apart from the data, because building the data
    rewrites a tree's merge keys (`<<: *anchor`) in place. `exact_marks`: the pure-Python parser,
    whose marks index `text` itself (an editor cuts the text at them); libyaml's lines are the
    same, but it may count an index otherwise."""
    loader = yaml.SafeLoader if exact_marks else _LOADER
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as err:
        raise error(f"{where} is not valid YAML: {err}") from None
    twice = duplicate_keys(root)
    if twice:
        lines = [f"{where}: key `{key}` appears twice in the same mapping, "
                 + (f"on line {first}" if first == second else f"at line {first} and line {second}")
                 + "; YAML would keep only the last one and silently drop the first: merge them into one"
                 for key, first, second in twice]
        raise error("\n".join(lines) + "\nfix the file, then run the command again")
    try:
        return yaml.load(text, Loader=loader), root
    except yaml.YAMLError as err:  # composed, but not constructible (an unknown tag)
        raise error(f"{where} is not valid YAML: {err}") from None


def read(path: Path, error: type[XceError] = ConfigError, where: str | None = None) -> tuple[Any, yaml.Node | None]:
    """parse() of the file at `path`. OSError (a missing file among them) is the caller's to word."""
    where = where or str(path)
    return parse(decode(path.read_bytes(), where, error), where, error)


def duplicate_keys(root: yaml.Node | None) -> list[tuple[str, int, int]]:
    """(key, first line, repeated line) for each scalar key repeated in a mapping of the tree, in
    the order of the repeats. An alias is walked once (a document may refer to itself)."""
    found, seen, todo = [], set(), [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != MERGE_TAG:
                    line = key.start_mark.line + 1
                    if (key.tag, key.value) in first:
                        found.append((key.value, first[(key.tag, key.value)], line))
                    else:
                        first[(key.tag, key.value)] = line
                todo += (key, value)
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value
    return sorted(found, key=lambda f: f[2])
