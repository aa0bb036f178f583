"""The xce_lite host agent and plain supervisor: the package that runs on every host.

Standard library only, and relative imports only (never an absolute `xce_lite.` one): hosts have
nothing but python3, and the controller ships this package as ONE generated file (exec/bundle.py;
loader.py is its top), run as `python3 -S -E agent-<hash>.py serve|exec|pre|post|launch ...`. The
commands, the JSON-lines protocol (version 3), the modes, the spool and the journal are described
in docs/agent-protocol.md.

One concern per module: util, jsonl and signals (small helpers); validate (what requests may
hold); journal and recorders (the spool's journal, and where a supervisor records its unit);
spawn, watch, tree, hooks, supervisor and steps (running a unit's job, its limits, hooks and
tasks, and stopping what it leaves, in plain mode or inside a systemd unit); dbus, probe and
systemd (the service manager, the host's facts, direct units); server (the Agent: its loop, and
the composition root of its parts, which share shared.AgentState and are given what they call:
state (journal, units' status), link and manager (systemd), zygote, lease, unitops, tasks and
reads (its requests by family)); launch (`xce launch`, the job's side); main (the commands).

This file stays a docstring: importing the package loads nothing.
"""
