"""The agent's JSON (exec/agent/jsonl.py): json's C encoder gives the text json.dumps gives, and the
pure-Python encoder (other Pythons) the same; both refuse what is not JSON, and lone surrogates
(undecodable bytes of an environment) survive a round trip."""

from __future__ import annotations

import json

import pytest

from xce_lite.exec.agent.jsonl import dumps, encode, encode_py, loads

VALUES = [
    {"event": "finished", "unit": "xce-1-1-0", "result": {"exit_code": 0, "signal": None, "cpu_time": 0.001,
                                                          "max_rss": 1 << 40, "ok": True, "no": False}},
    ["é", "\udcff", "\n\"\\", (1, 2.5, -0.0, 1e300, 2**70)],
    {"env": {"PATH": "/bin:/usr/bin", "X": "\u2603"}, "argv": [], "nested": [[{}], {"a": []}]},
]


@pytest.mark.parametrize("value", VALUES)
def test_encoders_write_what_json_dumps_writes(value):
    want = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    assert encode(value) == encode_py(value) == want
    assert loads(dumps(value)) == json.loads(want)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"a": [float("-inf")]}])
def test_encoders_refuse_nan_and_infinity(bad):
    for enc in (encode, encode_py):
        with pytest.raises(ValueError):
            enc(bad)


@pytest.mark.parametrize("bad", [object(), {"a": {1, 2}}, b"bytes"])
def test_encoders_refuse_other_kinds(bad):
    for enc in (encode, encode_py):
        with pytest.raises(TypeError):
            enc(bad)
