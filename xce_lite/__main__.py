"""`python -m xce_lite` is the same as the `xce` command (and says `xce` in its messages).

`python -m` puts the current directory first on sys.path, so a `yaml.py` or `json.py` there would
be imported instead of the library (the controller, started this way, would run it). The entry is
dropped before anything else is imported, unless it is where this package was found (a checkout
run from its root, whose processes need it).
"""

import os
import sys

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and sys.path[0] in ("", os.getcwd()) and os.path.abspath(sys.path[0] or ".") != _HERE:
    del sys.path[0]

from xce_lite.cli.main import main

if __name__ == "__main__":
    main(prog_name="xce")
