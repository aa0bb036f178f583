"""Where the data shipped with the package lies: the migrations (`sql/`) and the examples.

In an installed wheel they are the packages `xce_lite.sql` and `xce_lite.examples` (pyproject's
package-dir mapping); in a checkout, and in a default editable install (which ignores the mapping),
they are the folders `sql/` and `examples/` beside `xce_lite/`. Light: standard library only.
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def shipped(name: str) -> Traversable:
    """The folder `name` ("sql" or "examples"), from the installed package or else the checkout."""
    try:
        found = resources.files(f"xce_lite.{name}")
    except ModuleNotFoundError:
        found = None
    if found is not None and found.is_dir():
        return found
    return _CHECKOUT / name
