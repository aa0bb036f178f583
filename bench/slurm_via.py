"""What one Slurm command through a `via:` login host costs: wall time and the SSH gateway's CPU.

    python bench/slurm_via.py [COMMANDS]

Boots one plain test host (xce_lite.testhosts, as root; stopped by PID at the end) as the login
host and runs COMMANDS times, serially, the path a pool's squeue takes (exec/slurm.py over_ssh:
through the SSH gateway, on the connection it keeps open, the command in a login shell there,
its output streamed back), with `true` for the command, so that only the way there is measured; then the same number
of `true` run here by subprocess (what `via: local` pays besides Slurm itself). Prints the median
and p90 wall time per command and the gateway's CPU (user + system) per command. Asserts nothing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's xce_lite

from xce_lite import testhosts
from xce_lite.exec import slurm
from xce_lite.exec.sshgate import Gateway
from xce_lite.exec.sshtarget import SshTarget


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stats(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"median {statistics.median(ms):7.1f} ms   p90 {ms[int(0.9 * (len(ms) - 1))]:7.1f} ms"


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    base = Path(os.environ.get("XCE_TESTHOSTS_DIR", "~/.cache/xce-testhosts")).expanduser()  # not under /tmp
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xce-bench-via-", dir=base) as d:
        [host] = testhosts.up(1, Path(d) / "hosts", plain=True, die_with_caller=True, prefix="login")
        try:
            target = SshTarget(name=host.name, address=host.ip, user=host.user, identity=str(host.key_path),
                               ssh_config=None, known_hosts=(str(host.known_hosts_path),))
            run = slurm.over_ssh(target)
            run(["true"], None, 30.0)  # the gateway started, paramiko imported there
            gateway = Gateway.get().proc.pid
            cpu0, walls = cpu_seconds(gateway), []
            for _ in range(n):
                t = time.perf_counter()
                run(["true"], None, 30.0)
                walls.append(time.perf_counter() - t)
            cpu = (cpu_seconds(gateway) - cpu0) / n
            here = []
            for _ in range(n):
                t = time.perf_counter()
                subprocess.run(["true"], check=True)
                here.append(time.perf_counter() - t)
        finally:
            testhosts.down(Path(d) / "hosts")
    print(f"{n} commands, serially, on a 2-core machine (load {os.getloadavg()[0]:.1f})")
    print(f"via the login host (SSH gateway, login shell): {stats(walls)}   gateway CPU {cpu * 1000:.1f} ms each")
    print(f"here (subprocess):                             {stats(here)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
