"""A YAML file read as a pydantic model, and the one form of every config error.

`load_yaml` reads through yamlfile (UTF-8, valid YAML, no key twice) and validates; every error
is `FILE: field.path (line N): message` (`problem`), the line found in the YAML node tree, so that
the user is sent to the place to fix. Nothing is returned half-checked: ConfigError or the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from xce_lite.config import yamlfile
from xce_lite.errors import ConfigError

_M = TypeVar("_M", bound=BaseModel)


def load_yaml(path: Path, model: type[_M], missing: str, expected: str) -> tuple[_M, yaml.Node | None]:
    """`path` validated as `model`, with its YAML node tree (for the lines of later checks).

    ConfigError names the file, the field and its line; `missing` says what to do when the file does
    not exist, `expected` what its top level should be."""
    try:
        data, root = yamlfile.read(path)  # UTF-8, valid YAML, no key twice: or ConfigError
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist; {missing}") from None
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected {expected}")
    try:
        return model.model_validate(data), root
    except ValidationError as err:
        problems = [problem(path, root, tuple(item["loc"]), item["msg"]) for item in err.errors()]
        raise ConfigError("\n".join(problems) + "\nfix the file, then run the command again") from None


def problem(path: Path, root: yaml.Node | None, loc: tuple, message: str) -> str:
    """`FILE: field.path (line N): message`, the form every config error takes."""
    where = ".".join(str(p) for p in loc) or "(top level)"
    line = _line_of(root, loc)
    return f"{path}: {where}{f' (line {line})' if line else ''}: {message}"


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the YAML node at `loc`, or of the deepest ancestor that exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if pair is not None:  # the key's line: a block value starts on the line below it
                child, line = pair[1], pair[0].start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
