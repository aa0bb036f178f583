"""Submit's "could never run" check in-process (the real controller, tests/support/inproc.py): its
answer is remembered per request shape, and forgotten when the hosts change (reconfig)."""

from __future__ import annotations

import pytest

from tests.support.inproc import InProc
from xce_lite.errors import SpecError


def test_a_request_no_host_could_run_is_refused_until_a_reconfig_adds_room():
    p = InProc(hosts=("h1", "h2"), slots=2)
    try:
        p.step(0.1)
        for _ in range(2):  # the second answer comes from the memo, and says the same
            with pytest.raises(SpecError, match="needs at least 4 tasks"):
                p.submit(slots=4, resreq=("span[hosts=1]",))
        config = p.root / "xce.yaml"
        config.write_text(config.read_text().replace("slots: 2", "slots: 4"))
        p.ctl.config_api.reconfigure()
        job = p.submit(slots=4, resreq=("span[hosts=1]",))
        for _ in range(3):
            p.step(1.0)
        assert p.job(job).state == "RUN" and p.job(job).hosts[0][1] == 4
    finally:
        p.close()
