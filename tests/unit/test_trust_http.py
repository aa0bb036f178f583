"""The API's request parser and the submit-time text check: every malformed kind is refused with
its status and a message; a well-formed request parses whole, and only once all of it is there."""

from __future__ import annotations

import json

import pytest

from xce_lite.api import http1
from xce_lite.api.hygiene import unencodable
from xce_lite.api.limits import Limits
from xce_lite.errors import ConfigError

HEAD, BODY = 64 << 10, 1 << 20


def _post(body: bytes, length: str | None = None, extra: str = "") -> bytes:
    length = str(len(body)) if length is None else length
    return f"POST /xce/v1/jobs HTTP/1.1\r\nContent-Length: {length}\r\n{extra}\r\n".encode() + body


def test_a_whole_request_parses_and_the_rest_is_left_for_the_next():
    raw = _post(b'{"jobs": []}') + b"GET /xce/v1/status HTTP/1.1\r\n\r\n"
    request, used = http1.parse(raw, HEAD, BODY)
    assert (request.method, request.path, request.body, request.keep_alive) == ("POST", "/xce/v1/jobs",
                                                                                b'{"jobs": []}', True)
    following, _ = http1.parse(raw[used:], HEAD, BODY)
    assert following.path == "/xce/v1/status"


def test_bytes_so_far_are_not_yet_a_request():
    raw = _post(b'{"jobs": []}')
    for cut in (0, 10, raw.index(b"\r\n\r\n") + 2, len(raw) - 1):
        assert http1.parse(raw[:cut], HEAD, BODY) is None


def test_query_is_decoded_and_connection_close_is_seen():
    request, _ = http1.parse(b"GET /xce/v1/jobs?ids=1%2C2&all=1 HTTP/1.1\r\nConnection: close\r\n\r\n", HEAD, BODY)
    assert request.query == {"ids": "1,2", "all": "1"} and not request.keep_alive


@pytest.mark.parametrize("raw, status, words", [
    (_post(b"", "-5"), 400, "Content-Length must be a whole number"),
    (_post(b"", "abc"), 400, "Content-Length must be a whole number"),
    (_post(b"", "+5"), 400, "Content-Length must be a whole number"),
    (_post(b"", "1e3"), 400, "Content-Length must be a whole number"),
    (_post(b"", "5", "Content-Length: 6\r\n"), 400, "given twice"),
    (_post(b"", str(BODY + 1)), 413, "more than the"),
    (b"POST /xce/v1/jobs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "Content-Length"),
    (b"GET /xce/v1/jobs?ids=%ff HTTP/1.1\r\n\r\n", 400, "not percent-encoded UTF-8"),
    (b"GET /xce/v1/j\xc3\xa9 HTTP/1.1\r\n\r\n", 400, "must be ASCII"),
    (b"hello\r\n\r\n", 400, "not an HTTP/1.x request line"),
    (b"GET /xce/v1/status HTTP/1.1 extra\r\n\r\n", 400, "not an HTTP/1.x request line"),
    (b"GET /xce/v1/status HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header"),
    (b"DELETE /xce/v1/jobs HTTP/1.1\r\n\r\n", 405, "GET and POST"),
    (b"GET /" + b"a" * (HEAD + 10), 431, "longer than"),
])
def test_malformed_requests_are_refused_with_their_status(raw: bytes, status: int, words: str):
    with pytest.raises(http1.Malformed) as caught:
        http1.parse(raw, HEAD, BODY)
    assert caught.value.status == status and words in str(caught.value)


def test_an_oversized_body_is_refused_from_its_head_alone():
    with pytest.raises(http1.Malformed) as caught:
        http1.parse(_post(b"", str(10 ** 12)), HEAD, BODY)
    assert caught.value.status == 413


@pytest.mark.parametrize("body, words", [
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nests deeper"),
    (b'{"a":' * 65 + b"1" + b"}" * 65, "nests deeper"),
    (b'{"jobs": ["\xff"]}', "not UTF-8"),
    (b'{"jobs": ["\xed\xa0\x80"]}', "not UTF-8"),  # a surrogate, UTF-8-encoded: not UTF-8
    (b"\xff\xfe{\x00}\x00", "not UTF-8"),  # UTF-16: json.loads(bytes) would have guessed it
    (b'{"run_limit": NaN}', "not a JSON number"),
    (b'{"run_limit": Infinity}', "not a JSON number"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"),
    (b"{", "not valid JSON"),
])
def test_bodies_that_are_not_a_json_object_are_refused(body: bytes, words: str):
    with pytest.raises(http1.Malformed) as caught:
        http1.decode_body(body)
    assert caught.value.status == 400 and words in str(caught.value)


def test_a_json_object_decodes():
    doc = {"jobs": [{"argv": ["a\udcff"], "meta": {"x": [[[1]]]}}]}
    assert http1.decode_body(json.dumps(doc).encode()) == doc
    assert http1.decode_body(b"") is None


@pytest.mark.parametrize("spec, where", [
    ({"argv": ["printf", "x\ud800"]}, "argv[1]"),
    ({"argv": ["a"], "env": {"GOOD": "\udcff", "BAD": "\udfff"}}, "env.BAD"),
    ({"argv": ["a"], "env": {"N\ud800": "v"}}, "env (the name"),
    ({"argv": ["a"], "name": "n\udc00"}, "name"),
    ({"argv": ["a"], "exdata": {"app_params": {"P": "\ud83d"}}}, "exdata.app_params.P"),
])
def test_a_lone_surrogate_is_found_and_named(spec: dict, where: str):
    found = unencodable(spec)
    assert found is not None and found[0].startswith(where)


def test_undecodable_bytes_and_real_text_pass():
    # \udc80-\udcff is how Python carries a byte of argv or environ that is not UTF-8: it reaches
    # the job as that byte, so it is accepted
    assert unencodable({"argv": ["a\udcff\udc80", "é☃🙂"], "env": {"V\udcfe": "x"}, "name": "ok"}) is None


def test_limits_from_the_environment():
    limits = Limits.from_env("workers=3, idle_timeout=1.5")
    assert limits.workers == 3 and limits.idle_timeout == 1.5
    for text in ("nosuch=1", "workers=x", "workers=0"):
        with pytest.raises(ConfigError):
            Limits.from_env(text)
