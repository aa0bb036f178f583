"""Where things lie in the checkout under test."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "xce_lite"
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "examples"
