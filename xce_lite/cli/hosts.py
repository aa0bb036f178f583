"""`xce hosts [-l]`, `xce hosts add` and `xce queues`: the cluster's hosts and queues. Thin; light at
import (click and the standard library): `hosts add` loads fabric only when it runs.
"""

from __future__ import annotations

import re

import click

from xce_lite import errors
from xce_lite.cli.base import JSON_OPTION, client, echo_json, echo_table, table_lines
from xce_lite.cli.complete import complete_hosts
from xce_lite.cli.jobs import when
from xce_lite.home.paths import Home
from xce_lite.quantities import format_duration, format_size

# What an address may look like before anything resolves it: a host name or an IPv4/IPv6 address.
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]+|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}))$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class _HostsGroup(click.Group):
    """`xce hosts [-l] [NAMES]` beside `xce hosts add`: words that name no subcommand are hosts'
    names (the group's options are all flags, so every other word is one)."""

    def parse_args(self, ctx, args):
        words = [a for a in args if not a.startswith("-")]
        if words and words[0] not in self.commands:
            ctx.meta["hosts.names"] = tuple(words)
            args = [a for a in args if a.startswith("-")]
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx, incomplete):
        return super().shell_complete(ctx, incomplete) + complete_hosts(ctx, None, incomplete)


@click.group(cls=_HostsGroup, invoke_without_command=True)
@click.option("-l", "long", is_flag=True, help="Per resource: total, reserved and free; GPUs, attributes, tags.")
@JSON_OPTION
@click.pass_context
def hosts(ctx, long, as_json) -> None:
    """List the hosts with their state and slots, or only those named (`xce hosts -l gpu1`);
    `xce hosts add` adds one.

    Example: xce hosts -l
    """
    if ctx.invoked_subcommand is not None:
        return
    names = ctx.meta.get("hosts.names", ())
    reply = client(ctx).get("/hosts")
    if names:
        unknown = sorted(set(names) - {h["name"] for h in reply["hosts"]})
        if unknown:
            raise errors.NotFound(f"no host {', '.join(unknown)} in this cluster; the hosts are: "
                                  f"{', '.join(h['name'] for h in reply['hosts'])}")
        reply["hosts"] = [h for h in reply["hosts"] if h["name"] in names]
    if as_json:
        echo_json(reply)
        return
    if long:
        for pool in reply.get("pools", ()) if not names else ():
            click.echo(pool_text(pool))
        for h in reply["hosts"]:
            click.echo(f"HOST {h['name']}  ({h['type']}, {_host_status(h)}, {h['jobs']} jobs)")
            if h.get("unreach_why"):
                click.echo(f"  out of reach: {h['unreach_why']}")
            if h.get("trouble"):
                click.echo(f"  in trouble since {when(h['trouble_since'])} (no new work until it answers): "
                           f"{h['trouble']}")
            if h.get("refused"):
                click.echo(f"  refused by this shared cluster (no work): {h['refused']}")
            click.echo(f"  {agent_line(h.get('agent'))}")
            amounts = [("RESOURCE", "TOTAL", "RESERVED", "FREE")]
            for name, r in sorted(h["resources"].items()):
                amounts.append((name, *(_amount(name, r[k]) for k in ("total", "reserved", "free"))))
            echo_table(amounts)
            extra = [f"gpus free: {','.join(map(str, h['gpus_free']))}" if h["gpus_free"] else "",
                     " ".join(f"{k}={v}" for k, v in sorted(h["attrs"].items())),
                     f"tags: {' '.join(h['tags'])}" if h["tags"] else ""]
            click.echo("  ".join(e for e in extra if e) + "\n")
        return
    rows = [("HOST_NAME", "STATUS", "MAX", "NJOBS", "RUN", "MEM", "MODE")]
    for h in reply["hosts"]:
        mode = (h.get("agent") or {}).get("mode") or "-"
        state = "refused" if h.get("refused") else h["state"]  # a shared cluster gives it no work
        rows.append((h["name"], state, str(h["slots"]), str(h["used"]), str(h["jobs"]), format_size(h["mem"]),
                     mode))
    echo_table(rows)


def pool_text(pool: dict) -> str:
    """A pool of Slurm allocations for `xce hosts -l`: its settings, then each allocation with its
    Slurm job id, state, time left or Slurm's reason, and its hosts."""
    via = f", via {pool['via']}" if pool.get("via", "local") != "local" else ""
    lines = [f"POOL {pool['name']}  ({pool['type']}{via}, partition {pool['partition'] or 'default'}, "
             f"at most {pool['max_allocations']} allocation(s) of {format_duration(pool['time_limit'])}, "
             f"released after {format_duration(pool['idle_timeout'])} idle)"]
    if pool.get("trouble"):
        lines.append(f"  Slurm in trouble since {when(pool['trouble_since'])}: {pool['trouble']}")
    rows = [("ALLOCATION", "STATE", "TIME_LEFT", "HOSTS", "REASON")]
    for a in pool["allocations"]:
        left = format_duration(a["time_left"]) if a["time_left"] is not None else "-"
        why = a["reason"] or (f"releasing: {a['release']}" if a.get("release") else "")
        rows.append((a["job_id"] or "-", a["state"], left, " ".join(a["hosts"]) or "-", why or "-"))
    if len(rows) == 1:
        rows.append(("-", "none yet", "-", "-", "submitted when jobs wait that the pool could run"))
    return "\n".join([*lines, *("  " + line for line in table_lines(rows)), ""])


def check_host_fields(name: str, address: str | None, mem: str | None) -> None:
    """Refuse what no probe should be tried with, before anything is resolved or connected."""
    if not _HOST_NAME.match(name):
        raise click.BadParameter(f"{name!r} is not a host name: letters, digits, _ . - (at most 63), starting with a "
                                 f"letter or digit", param_hint="NAME")
    if address is not None and not _ADDRESS.match(address):
        raise click.BadParameter(f"{address!r} is not a host name or an IP address", param_hint="--address")
    if mem is not None:
        from xce_lite.quantities import parse_size

        try:
            parse_size(mem, "--mem")
        except errors.SpecError as err:
            raise click.BadParameter(str(err), param_hint="--mem") from None


@hosts.command("add")
@click.argument("name")
@click.option("--address", help="Its address (default: NAME, as your SSH config resolves it).")
@click.option("--port", type=click.IntRange(1, 65535), help="Its SSH port (default: the SSH config's, or 22).")
@click.option("--user", help="Whom to log in as (default: the SSH config's, or you).")
@click.option("--identity", metavar="FILE", help="The private key to log in with.")
@click.option("--python", help="The host's Python 3 (default: python3 on its PATH).")
@click.option("--launch", type=click.Choice(["auto", "systemd", "user", "plain"]), default="auto", show_default=True,
              help="How jobs run there: systemd units, user units, or the plain supervisor.")
@click.option("--slots", type=click.IntRange(1, 100_000), help="Slots to offer (default: its CPUs).")
@click.option("--mem", help="Memory to offer, e.g. 64G (default: all of it).")
@click.option("--accept-new", is_flag=True, help="Trust the host's key if no known_hosts file knows it yet.")
@click.option("--dry-run", is_flag=True, help="Probe and show, but do not change xce.yaml.")
@click.pass_context
def hosts_add(ctx, name, address, port, user, identity, python, launch, slots, mem, accept_new, dry_run) -> None:
    """Probe a host over SSH, show what it is and how jobs would run there, and add it to xce.yaml.

    Its host key must be known (your known_hosts, the cluster's); an unknown one is refused with its
    fingerprint: check it, then add --accept-new. A running controller connects the host at once.

    Example: xce hosts add gpu1 --address 10.0.0.5 --user alice --accept-new
    """
    from xce_lite.controller import daemon
    from xce_lite.home.hostadd import add_host

    home: Home = ctx.obj.require()
    check_host_fields(name, address, mem)
    fields = {"address": address, "port": port, "user": user, "identity": identity, "python": python,
              "launch": launch}
    added = add_host(home, name, fields, slots=slots, mem=mem, accept_new=accept_new, dry_run=dry_run)
    probe = added.probe
    agent = {"hostname": probe.hostname, "cpus": probe.cpus, "mem": probe.mem, "version": probe.agent_version,
             **probe.extra}
    click.echo(f"Host {name} answers: {agent_line(agent, fresh=True)}")
    if not added.entry:
        click.echo(f"Host {name} was in {home.config} already: its host key is trusted now.")
        if daemon.lock_holder(home) is not None:
            client(ctx).post("/hosts/reconnect", {"names": [name]})
        return
    offered = f"slots {added.entry['slots']}, mem {added.entry['mem']}" + (
        f", gpus {added.entry['gpus']}" if added.entry.get("gpus") else "")
    if not added.written:
        click.echo(f"Would add it to {home.config} with {offered} (--dry-run: nothing written).")
        return
    click.echo(f"Added it to {home.config} with {offered}.")
    if daemon.lock_holder(home) is None:
        click.echo("Start the controller to use it: `xce controller start`.")
        return
    client(ctx).post("/controller/reconfig", {})
    click.echo("The controller is connecting to it now; `xce hosts` shows when it is ok.")


def _host_status(h: dict) -> str:
    if h["state"] == "ok" or not h.get("unreach_since"):
        return h["state"]
    return f"{h['state']} since {when(h['unreach_since'])}" + ("; lost: its jobs were requeued or ended"
                                                                 if h.get("lost") else "")


_MODE_WORDS = {"systemd": "systemd system units", "user": "systemd user units", "plain": "the plain supervisor"}
_BETTER_FIRST = ("systemd", "user", "plain")  # what `launch: auto` prefers, in order


def agent_line(agent: dict | None, fresh: bool = False) -> str:
    """How the host runs jobs, as its agent said when it last connected (`fresh`: just now). Only
    the modes it would prefer to the one it uses say what they miss: advice about user units is
    noise on a host that runs system units."""
    if not agent:
        return "agent: not connected yet"
    mode = agent.get("mode") or "plain"
    words = [f"jobs run under {_MODE_WORDS.get(mode, mode)}", f"agent v{agent['version']} on {agent['hostname']}",
             f"{agent['cpus']} cpus", format_size(agent["mem"])]
    if agent.get("load"):
        words.append("load " + " ".join(f"{x:.2f}" for x in agent["load"]) + ("" if fresh else " (when it connected)"))
    if agent.get("gpus"):
        words.append(f"{len(agent['gpus'])} gpus")
    lines = ["agent: " + ", ".join(words)]
    if agent.get("can_switch_user") is False:  # a shared controller cannot use it (issue 16)
        lines.append(f"  jobs run only as the agent's user: {agent.get('can_switch_user_why') or 'it is not root'}")
    better = _BETTER_FIRST[:_BETTER_FIRST.index(mode)] if mode in _BETTER_FIRST else ()
    for other, info in sorted((agent.get("modes") or {}).items()):
        if other in better and isinstance(info, dict) and not info.get("ok") and info.get("why"):
            lines.append(f"  no {_MODE_WORDS.get(other, other)}: {info['why']}")
    return "\n  ".join(lines)


@click.command()
@JSON_OPTION
@click.pass_context
def queues(ctx, as_json) -> None:
    """List the queues with their priority and jobs.

    Example: xce queues
    """
    reply = client(ctx).get("/queues")
    if as_json:
        echo_json(reply)
        return
    rows = [("QUEUE_NAME", "PRIO", "DEFAULT", "PEND", "RUN", "DESCRIPTION")]
    for q in reply["queues"]:
        fair = q.get("fairshare")
        who = [*(q.get("users") or ()), *(f"@{g}" for g in q.get("groups") or ())]
        limited = q.get("users") is not None or q.get("groups") is not None  # queue ACL: who may submit
        rows.append((q["name"], str(q["priority"]), "yes" if q["default"] else "", str(q["pend"]), str(q["run"]),
                     q["description"] + (f" (fair share by {fair['by']})" if fair else "")
                     + (f" (for {', '.join(who) or 'admins only'})" if limited else "")))
    echo_table(rows)


def _amount(name: str, value: float) -> str:
    if name == "mem":
        return format_size(int(value)) if value > 0 else "0"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
