"""JSON without the json package: the protocol's lines, journal records and spec files.

The C module under `json` only: its Python wrapper imports re (and enum through it), some ms of
every unit's start under systemd, where `exec` and `post` are fresh interpreters. Output is compact
ASCII-only JSON, so that lone surrogates (undecodable bytes from os.environ) survive a round trip.
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - other Pythons
    _json = None  # type: ignore[assignment]  # None: no C scanner here, which a module type cannot say


class _JsonContext:
    """What the C scanner of `json` reads from its decoder: strict JSON into plain dicts and numbers."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"{name} is not JSON")


if _json is not None:
    # the C scanner reads its decoder's attributes (duck-typed); typeshed asks for a JSONDecoder
    _scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]
    _quote = _json.encode_basestring_ascii
else:  # pragma: no cover - other Pythons
    import json as _std_json

    _scan, _quote = _std_json.JSONDecoder().scan_once, _std_json.encoder.encode_basestring_ascii


def loads(text: str | bytes | bytearray) -> Any:
    """json.loads, without importing json (see the module docstring)."""
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8")
    start = len(text) - len(text.lstrip(" \t\r\n"))
    try:
        try:
            obj, end = _scan(text, start)
        except SystemError:  # the C scanner words some errors with json.decoder, if it is loaded
            import json.decoder  # noqa: F401 - only for a malformed line (a torn record)

            obj, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"no JSON value at character {exc.value}") from None
    if text[end:].strip(" \t\r\n"):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return obj


def _refuse(obj: object) -> object:
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


# json's C encoder, as json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False,
# check_circular=False) makes it: ~2x faster than encode_py below (every protocol line, journal
# record and spec goes through here, per job); the same text, but that it writes a dict's int,
# float, bool or None keys as strings (as json.dumps) where encode_py refuses them
_c_encoder = None if _json is None else _json.make_encoder(None, _refuse, _quote, None, ":", ",", False, False, False)


def encode(obj: object) -> str:
    """Compact ASCII-only JSON of dicts (string keys), lists, strings, numbers, bools and None:
    json.dumps(obj, ensure_ascii=True, separators=(",", ":")), without importing json. ValueError
    for a NaN or an infinity, TypeError for any other kind of value."""
    if _c_encoder is not None:
        return "".join(_c_encoder(obj, 0))
    return encode_py(obj)  # pragma: no cover - other Pythons


def encode_py(obj: object) -> str:
    """encode() in Python, where json's C encoder is not to be had."""
    if isinstance(obj, str):
        return _quote(obj)
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            raise ValueError(f"{obj} is not JSON")
        return float.__repr__(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(_quote(k) + ":" + encode_py(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join([encode_py(v) for v in obj]) + "]"
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def dumps(obj: object) -> bytes:
    """One protocol line. ASCII-only so lone surrogates (undecodable bytes in env) survive."""
    return encode(obj).encode("ascii") + b"\n"
