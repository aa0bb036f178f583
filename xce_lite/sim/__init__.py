"""The simulator: the controller's own scheduler core and merge on a simulated clock and hosts.

`workload` reads what is submitted (YAML or CSV), `engine` runs it (fake hosts behind the exec seam,
exec/fake.py), `record` writes and verifies recordings, `trace` renders and stores traced
decisions, `repl` is the interactive stepper, `export` turns a live store's history into a workload,
and `cli` is `xce sim`. Deterministic: the same config and workload give the same bytes out.
"""
