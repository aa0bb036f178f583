"""The simulator: the controller's own tick on a simulated clock and fake hosts.

`workload` reads what is submitted (YAML or CSV), `ticked` runs it through the real controller
(`controlled`: the controller on fake hosts behind the exec seam, exec/fake.py, and a fake clock),
`batch` runs a whole simulation with its recording and snapshots, `record` writes and verifies
recordings, `trace` renders and stores traced decisions, `repl` is the interactive stepper, `report`
sums a run up, `export` turns a live store's history into a workload, and `cli` is `xce sim`.
Deterministic: the same config and workload give the same bytes out.
"""
