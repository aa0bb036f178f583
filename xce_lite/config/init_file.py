"""The xce.yaml that `xce init` writes: a commented one-host cluster on this machine.

Its text must load with config/cluster.load_config as it is (tests/unit/test_config.py checks it).
"""

from __future__ import annotations

import os
import re

from xce_lite.config.fields import NAME


def detect_memory() -> int:
    """Total memory of this machine in bytes (sysconf; no psutil on this path)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_config_text(cluster: str, host: str, slots: int, mem: int) -> str:
    """The commented xce.yaml that `xce init` writes for a one-host cluster on this machine."""
    mem_text = f"{mem // 1024**2}M"
    host = host if re.match(NAME, host) else "localhost"
    return f"""\
# xce.yaml: the configuration of this xce_lite cluster.
# Edit it, then restart the controller (`xce controller stop; xce controller start`).

# The cluster's name: part of every unit name and agent directory on the hosts. `xce init` chose one
# no other cluster home on this machine uses; two clusters of one name would collide on their hosts.
cluster: '{cluster}'

# The machines that run jobs. `local` is the machine the controller runs on.
# slots: how many tasks run at once (one per CPU by default); mem: memory to hand out (512M, 4G, ...).
hosts:
  - name: '{host}'
    type: local
    slots: {slots}
    mem: {mem_text}

# Queues order the work: higher priority is scheduled first; `default: true` takes jobs that name none.
queues:
  - name: normal
    priority: 30
    default: true
    description: the default queue

# The controller's own settings (these are the defaults).
controller:
  tick: 1s      # how often it looks again when nothing woke it
  grace: 10s    # between TERM and KILL when a job is killed or reaches its run limit
"""
