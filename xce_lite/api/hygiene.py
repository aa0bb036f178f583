"""Text a job can be given: the check that refuses a lone surrogate at submit.

A JSON string may hold a UTF-16 surrogate on its own (`"\\ud800"`), which is no text and encodes to
no bytes: observed, such an argument was accepted, the job then failed in its supervisor with
UnicodeEncodeError, and `xce jobs -l` crashed on it. Surrogates U+DC80..U+DCFF are different: they
are how Python carries an undecodable byte of argv or the environment (surrogateescape), and they
reach the job as that byte. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any


def unencodable(doc: Any, where: str = "") -> tuple[str, str] | None:
    """(where, the offending text) of the first string in `doc`, key or value, that no byte
    sequence stands for; None if every string can reach a job byte for byte."""
    if "\\ud" not in repr(doc):  # no surrogate anywhere (repr writes each as \udXXXX): no walk, no paths
        return None
    stack: list[tuple[Any, str]] = [(doc, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if not _encodable(node):
                return path or "the request", node
        elif isinstance(node, dict):
            for key, value in reversed(list(node.items())):
                if isinstance(key, str) and not _encodable(key):
                    return f"{path or 'the request'} (the name {key!r})", key
                stack.append((value, f"{path}.{key}" if path else str(key)))
        elif isinstance(node, list):
            stack.extend((value, f"{path}[{i}]") for i, value in reversed(list(enumerate(node))))
    return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True
