"""`python -m xce_lite` is the same as the `xce` command (and says `xce` in its messages)."""

from xce_lite.cli.main import main

if __name__ == "__main__":
    main(prog_name="xce")
