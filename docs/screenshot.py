"""Make docs/web-overview.png, the README's picture of `xce web`: a small demo cluster (two local
hosts, three queues) runs a few minutes of jobs, then headless Chromium takes the overview.

    python3 docs/screenshot.py          # from the repository root, as root; about four minutes
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = str(ROOT)

from tests.support.cluster import Cluster
from tests.support.web import dashboard

CONFIG = f"""\
cluster: demo{os.getpid()}
hosts:
  - {{name: node1, slots: 8, mem: 16G, gpus: 2}}
  - {{name: node2, slots: 4, mem: 8G}}
queues:
  - {{name: normal, default: true}}
  - {{name: short, priority: 50, run_limit: 10m}}
  - {{name: gpu, hosts: [node1], running_limit: 2}}
controller: {{tick: 1s, grace: 2s}}
"""


def main() -> None:
    rng = random.Random(7)
    c = Cluster(config=CONFIG)
    try:
        c.start()
        start = time.monotonic()
        while time.monotonic() - start < 200:  # a few minutes of arrivals: the charts get a shape
            queue, tasks = rng.choice([("normal", "1"), ("normal", "2"), ("short", "1"), ("normal", "1,3")])
            c.submit("sleep", str(rng.randint(15, 70)),
                     options=("-q", queue, "-n", tasks, "-J", f"sim{rng.randint(1, 99)}"))
            time.sleep(rng.uniform(1, 6))
        for name in ("train", "train", "train-big"):
            c.submit("sleep", "300", options=("-q", "gpu", "--gpus", "1", "-J", name))
        c.submit("true", options=("-J", "report", "-w", "done(train)"))
        c.submit("true", options=("-J", "later", "--hold"))
        c.submit("sleep", "60", options=("-n", "12", "-J", "wide"))
        time.sleep(5)
        with dashboard(c, ROOT / "docs") as (web, browser):
            page = browser.page()
            page.goto(web.link)
            page.wait_for_selector("#totals")
            page.goto(web.base + "?hours=0.1")
            page.wait_for_selector("[data-chart=queue][data-drawn='1'] canvas")
            page.screenshot(path=str(ROOT / "docs" / "web-overview.png"), full_page=True)
            browser.check()
        print("wrote docs/web-overview.png")
    finally:
        c.close()

if __name__ == "__main__":
    main()
