"""The wheel ships the package, its migrations, its examples and the dashboard's assets, and never a test.

Built for real with `pip wheel` from a copy of the tracked files (so a build leaves nothing in the
checkout), with junk planted where a user's run would leave it: the pipeline example's run/ folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.support import paths


def tracked_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=paths.ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = paths.ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_the_package_list_names_every_package_of_the_tree() -> None:
    config = tomllib.loads((paths.ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    tree = {".".join(p.parent.relative_to(paths.ROOT).parts) for p in paths.PACKAGE.rglob("__init__.py")}
    assert listed - {"xce_lite.sql", "xce_lite.examples"} == tree
    assert config["package-dir"] == {"xce_lite.sql": "sql", "xce_lite.examples": "examples"}


def test_the_wheel_holds_migrations_and_examples_and_no_tests(tmp_path: Path) -> None:
    source = tracked_copy(tmp_path / "src")
    (source / "examples" / "pipeline" / "run" / "logs").mkdir(parents=True)
    (source / "examples" / "pipeline" / "run" / "logs" / "1_1.out").write_text("left by a run\n")
    out = tmp_path / "wheel"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                           capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr
    [wheel] = out.glob("xce_lite-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    sql = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("xce_lite/sql/"))
    assert sql == sorted(p.name for p in (paths.ROOT / "sql").glob("*.sql"))
    shipped_examples = {n.removeprefix("xce_lite/examples/") for n in names if n.startswith("xce_lite/examples/")}
    examples = source / "examples"
    tracked_examples = {str(p.relative_to(examples)) for p in examples.rglob("*")
                        if p.is_file() and "run" not in p.relative_to(examples).parts}
    assert shipped_examples == tracked_examples
    web = source / "xce_lite" / "web"  # the dashboard's templates and assets, the vendored ones with their licence
    assets = {str(p.relative_to(source)) for d in ("templates", "static") for p in (web / d).rglob("*") if p.is_file()}
    assert "xce_lite/web/static/vendor/uplot/LICENSE" in assets
    assert assets <= set(names), f"missing from the wheel: {sorted(assets - set(names))}"
    assert not [n for n in names if n.startswith(("tests/", "xce_lite/tests")) or "/test_" in n or "conftest" in n]
    assert not [n for n in names if "/run/" in n]
