"""Every module of xce_lite/, tests/ and bench/ stays under ~400 lines (issue 15; STYLE.md 18): a
longer one has usually grown a second job, and the next engineer reads it whole to change one.

A module may stay longer only when EXCEPTIONS names it with why: a split under way, or a reason it
is better whole. An exception that no longer holds (the module is gone, or now under the limit)
fails too, so that the list says only what is true.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import paths

LIMIT = 400
ROOTS = ("xce_lite", "tests", "bench")

# path -> why it may be longer (none today: a module over the limit is split by concern)
EXCEPTIONS: dict[str, str] = {}


def line_count(path: Path) -> int:
    """Lines as `wc -l` counts them (a last line without its newline counts too)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def modules(root: Path) -> list[Path]:
    return sorted(p for name in ROOTS for p in (root / name).rglob("*.py") if "__pycache__" not in p.parts)


def too_long(root: Path, exceptions: dict[str, str]) -> list[str]:
    """`path: N lines` for each module over LIMIT that no exception names."""
    found = []
    for path in modules(root):
        rel = path.relative_to(root).as_posix()
        lines = line_count(path)
        if lines > LIMIT and rel not in exceptions:
            found.append(f"{rel}: {lines} lines")
    return found


def stale(root: Path, exceptions: dict[str, str]) -> list[str]:
    """Each exception that no longer holds: no reason given, the module gone, or now under LIMIT."""
    found = []
    for rel, why in sorted(exceptions.items()):
        path = root / rel
        if not why.strip():
            found.append(f"{rel}: no reason given")
        elif not path.is_file():
            found.append(f"{rel}: no such module any more")
        elif line_count(path) <= LIMIT:
            found.append(f"{rel}: {line_count(path)} lines, under the limit now")
    return found


def test_every_module_is_under_the_limit_or_named_with_why() -> None:
    found = too_long(paths.ROOT, EXCEPTIONS)
    assert found == [], (f"modules over {LIMIT} lines: split each by concern into modules of one job "
                         f"(or add it to EXCEPTIONS in {Path(__file__).name} with why):\n  " + "\n  ".join(found))


def test_every_exception_still_holds() -> None:
    found = stale(paths.ROOT, EXCEPTIONS)
    assert found == [], (f"remove these from EXCEPTIONS in {Path(__file__).name}, or give a reason:\n  "
                         + "\n  ".join(found))


def test_the_check_counts_lines_as_wc_does_and_names_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "xce_lite" / "sub").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "xce_lite" / "sub" / "long.py").write_text("x = 1\n" * LIMIT + "y = 2")  # LIMIT + 1 lines
    (tmp_path / "tests" / "fits.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "bench" / "notes.txt").write_text("x\n" * (LIMIT + 5))  # not a module
    (tmp_path / "xce_lite" / "__pycache__").mkdir()
    (tmp_path / "xce_lite" / "__pycache__" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    assert too_long(tmp_path, {}) == [f"xce_lite/sub/long.py: {LIMIT + 1} lines"]
    assert too_long(tmp_path, {"xce_lite/sub/long.py": "why"}) == []
    assert stale(tmp_path, {"xce_lite/sub/long.py": "why"}) == []
    assert stale(tmp_path, {"xce_lite/sub/long.py": " ", "tests/fits.py": "why", "gone.py": "why"}) == [
        "gone.py: no such module any more", f"tests/fits.py: {LIMIT} lines, under the limit now",
        "xce_lite/sub/long.py: no reason given"]
