"""Adding a real host to a cluster (`xce hosts add NAME`): probe it over SSH, then write it down.

The probe is a real connection: the host key is checked (an unknown key is refused with its
fingerprint; `accept_new` trusts it from now on, in <home>/known_hosts), the agent is copied if
the host lacks this version of it, and it reports what the host is: CPUs, memory, load, GPUs, and
how jobs would run there (systemd system units, user units, or the plain supervisor, with what is
missing for the others). Only then is the host added to xce.yaml, with the slots, memory and GPUs
found (or given), keeping the file's comments and layout (config_edit.py). Nothing is written when
the probe fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from xce_lite.config.cluster import ClusterConfig, HostConfig, load_config
from xce_lite.errors import SpecError
from xce_lite.exec.host import HostProbe
from xce_lite.home import config_edit
from xce_lite.home.paths import Home


def ssh_target(host: HostConfig, config: ClusterConfig, home: Home):
    """How to reach an ssh host, as plain values: the host's own settings, then the cluster's."""
    from xce_lite.exec.sshtarget import SshTarget

    ssh = config.ssh
    return SshTarget(name=host.name, address=host.address, port=host.port, user=host.user, identity=host.identity,
                     ssh_config=ssh.config, known_hosts=tuple(ssh.known_hosts), accepted_keys=str(home.known_hosts),
                     connect_timeout=ssh.connect_timeout, keepalive=ssh.keepalive, python=host.python or "python3")


@dataclass(frozen=True)
class Added:
    entry: dict[str, Any]  # the host as written to xce.yaml
    probe: HostProbe
    written: bool  # False with dry_run


def add_host(home: Home, name: str, fields: dict[str, Any], slots: int | None = None, mem: str | None = None,
             accept_new: bool = False, dry_run: bool = False) -> Added:
    """Probe host `name` (with `fields`: address, port, user, identity, python, spool, launch; None
    ones are left out), then add it to the home's xce.yaml. A host already there is only probed
    with `accept_new`, to trust its key (`Added.entry` is then empty); without it, SpecError.
    HostKeyError, HostUnreachable or ConfigError say what to fix, and nothing is written."""
    from xce_lite.exec.ssh import probe  # fabric and paramiko: only when a host is added

    config = load_config(home.config)
    known = next((h for h in config.hosts if h.name == name), None)
    if known is not None:
        if not accept_new or known.type != "ssh":
            raise SpecError(f"host {name} is already in {home.config}; edit it there, or remove it first"
                            + (" (to trust its new host key, add --accept-new)" if known.type == "ssh" else ""))
        found = probe(ssh_target(known, config, home), known.agent_spool(config.cluster), mode=known.launch,
                      accept_new=True, log_path=home.root / f"agent-{name}.log")
        return Added({}, found, False)  # its key is trusted now; the file stays as it is
    given = {key: value for key, value in fields.items() if value is not None and value != ""}
    if given.get("launch") == "auto":
        del given["launch"]
    try:
        # validates the fields (a dict: pydantic parses `mem`'s text, "8G", into bytes)
        draft = HostConfig.model_validate({"name": name, "type": "ssh", "slots": slots or 1, "mem": mem or 1, **given})
    except ValidationError as err:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the host'}: {e['msg']}" for e in err.errors())
        raise SpecError(f"cannot add host {name!r}: {wrong}; nothing was written") from None
    found = probe(ssh_target(draft, config, home), draft.agent_spool(config.cluster), mode=draft.launch,
                  accept_new=accept_new, log_path=home.root / f"agent-{name}.log")
    entry: dict[str, Any] = {"name": name, "type": "ssh", **given,
                             "slots": slots or found.cpus, "mem": mem or f"{found.mem // 2**20}M"}
    gpus = found.extra.get("gpus") or []
    if gpus:
        entry["gpus"] = len(gpus)
    if not dry_run:
        config_edit.add_host(home.config, entry, comment=f"added by `xce hosts add` on {time.strftime('%Y-%m-%d')}")
    return Added(entry, found, not dry_run)
