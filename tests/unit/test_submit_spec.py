"""`xce submit`'s client-side checks (cli/submit.py build_spec): typos that used to be accepted and
fail later are refused at once, naming the option and what to write instead."""

from __future__ import annotations

import click
import pytest

from xce_lite.cli.submit import build_spec


def _refused(options: dict, *words: str) -> str:
    with pytest.raises(click.BadParameter) as err:
        build_spec(options, ["true"])
    message = err.value.format_message()
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("name", ["a[1-10", "a]", "a[1-3][4]", "x[y"])
def test_a_name_with_unclosed_or_stray_brackets_is_not_a_plain_job(name):
    _refused({"name": name}, "-J", "brackets make an array")


def test_a_name_with_an_array_part_is_still_an_array():
    spec = build_spec({"name": "sims[1-10]%2"}, ["true"])
    assert spec["name"] == "sims" and spec["array"] == "[1-10]%2"


@pytest.mark.parametrize("key, flag", [("stdout", "-o"), ("stderr", "-e")])
def test_an_output_file_that_is_an_existing_directory_is_refused(tmp_path, key, flag):
    message = _refused({key: str(tmp_path), "cwd": str(tmp_path)}, flag, "is a directory; name a file in it")
    assert "xce-%J.out" in message
    assert build_spec({key: "out-%J.txt", "cwd": str(tmp_path)}, ["true"])[key] == str(tmp_path / "out-%J.txt")


@pytest.mark.parametrize("resreq", [[""], ["  "], ["rusage[mem=1G]", ""]])
def test_an_empty_resource_requirement_is_refused(resreq):
    _refused({"resreq": resreq}, "-R", "the requirement is empty")


def test_an_unknown_condition_names_itself():
    _refused({"depend": "finished(3)"}, "-w", "unknown condition 'finished'")
