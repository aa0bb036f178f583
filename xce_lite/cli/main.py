"""`xce`: the command line. Thin: each command parses, calls the controller (or one library
function), prints.

Exit codes: 0 ok; 1 a job failed (`xce wait`) or an operation was refused; 2 bad input (nothing was
stored); 3 the controller is not running; 124 `xce wait --timeout` ran out.
The submit path imports only light modules (no pydantic, no apsw, no fabric): one `xce submit` must
cost little more than starting Python.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from xce_lite import errors
from xce_lite.api.client import Client
from xce_lite.cli.apps import apps, effective_lines, reconfig, table_lines
from xce_lite.cli.flow import flow as flow_group
from xce_lite.cli.jobs import display, jobs, outcome, when
from xce_lite.cli.presets import preset as preset_group
from xce_lite.cli.submit import build_spec, expand, given_options, submit_options
from xce_lite.cli.web import metrics as metrics_command
from xce_lite.cli.web import web as web_command
from xce_lite.config import presets
from xce_lite.home.paths import Home, resolve_home
from xce_lite.quantities import format_size
from xce_lite.sim.cli import sim as sim_group

EXIT_TIMEOUT = 124


class _Group(click.Group):
    """Turns XceError into `xce: message` and its exit code, instead of a traceback."""

    prefix = "xce"

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except errors.XceError as err:
            click.echo(f"{self.prefix}: {err}", err=True)
            ctx.exit(err.exit_code)


HOME_OPTION = click.option("--home", envvar="XCE_HOME", metavar="DIR",
                           help="The cluster home (default: $XCE_HOME, else ~/.xce).")
GROUP_SETTINGS = {"help_option_names": ["-h", "--help"]}


@click.group(cls=_Group, context_settings=GROUP_SETTINGS)
@HOME_OPTION
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """xce_lite: an LSF-style batch engine. Start with `xce quickstart`."""
    ctx.obj = resolve_home(home)


def _client(ctx: click.Context) -> Client:
    home: Home = ctx.obj.require()
    return Client(home.socket)


# ---- set-up -------------------------------------------------------------------------------------


@main.command()
@click.option("--cluster", default="xce", show_default=True, help="The cluster's name (part of unit names).")
@click.pass_context
def init(ctx: click.Context, cluster: str) -> None:
    """Create a cluster home with an xce.yaml for a one-host cluster on this machine.

    Example: xce init && xce controller start
    """
    _init(ctx.obj, cluster)


def _init(home: Home, cluster: str) -> None:
    from xce_lite.config.cluster import default_config_text, detect_memory, load_config

    if home.config.exists():
        raise errors.HomeError(f"{home.config} already exists; edit it, or choose another home with --home")
    home.root.mkdir(parents=True, exist_ok=True)
    host = os.uname().nodename.split(".")[0]
    text = default_config_text(cluster, host, os.cpu_count() or 1, detect_memory())
    tmp = home.config.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, home.config)
    load_config(home.config)  # what we wrote must load: fail here, not at controller start
    click.echo(f"Created {home.config} (one host, {os.cpu_count()} slots, queue normal).")
    click.echo("Next: `xce controller start`, then `xce submit -- echo hello`.")


@main.command()
@click.pass_context
def quickstart(ctx: click.Context) -> None:
    """Create the home if needed, start the controller, run an example job and show its output.

    Example: pip install . && xce quickstart
    """
    from xce_lite.controller import daemon

    home: Home = ctx.obj
    if not home.config.exists():
        _init(home, "xce")
    if daemon.lock_holder(home) is None:
        pid = daemon.start_detached(home.require())
        click.echo(f"Controller started (pid {pid}), serving {home.socket}.")
    client = Client(home.socket)
    out = home.root / "quickstart.out"
    spec = {"argv": ["sh", "-c", 'echo "hello from job $XCE_JOBID on $(hostname)"'], "cwd": str(home.root),
            "name": "quickstart", "stdout": str(out), "env": dict(os.environ)}
    job_id = client.post("/jobs", {"jobs": [spec]})["ids"][0]
    click.echo(f"Job <{job_id}> is submitted to queue <normal>.")
    reply = _wait_for(client, [job_id], timeout=60)
    _print_wait(reply)
    click.echo(f"Its output ({out}):")
    click.echo(out.read_text(errors="replace").rstrip())
    click.echo("\nNow try: xce submit -n 1 -- sleep 5; xce jobs; xce hosts. See README.md for a tour.")


# ---- controller -----------------------------------------------------------------------------------


@main.group()
def controller() -> None:
    """Start, stop or look at the controller of this cluster home."""


@controller.command("start")
@click.option("--foreground", is_flag=True, help="Stay in the foreground (for systemd or tmux); log to stderr.")
@click.pass_context
def controller_start(ctx: click.Context, foreground: bool) -> None:
    """Start the controller (detached, logging to <home>/controller.log).

    Example: xce controller start
    """
    home: Home = ctx.obj.require()
    if foreground:
        from xce_lite.controller.core import run_foreground

        run_foreground(home)
        return
    from xce_lite.controller import daemon

    pid = daemon.start_detached(home)
    click.echo(f"Controller started (pid {pid}), serving {home.socket}; log: {home.log}")


@controller.command("stop")
@click.pass_context
def controller_stop(ctx: click.Context) -> None:
    """Stop the controller. Running jobs go on; the next start adopts them.

    Example: xce controller stop
    """
    from xce_lite.controller import daemon

    pid = daemon.stop(ctx.obj.require())
    click.echo("No controller was running." if pid is None else f"Controller (pid {pid}) stopped.")


@controller.command("status")
@click.pass_context
def controller_status(ctx: click.Context) -> None:
    """Say whether the controller runs, and what it holds. Exit 3 if it does not run.

    Example: xce controller status
    """
    status = _client(ctx).get("/status")
    jobs = status["jobs"]
    click.echo(f"Controller of cluster {status['cluster']} is running (pid {status['pid']}) at "
               f"{status['home']}: {jobs['pending']} pending, {jobs['held']} held, {jobs['active']} running.")


# ---- the practice cluster --------------------------------------------------------------------------


@main.group()
def lab() -> None:
    """A practice cluster: real SSH hosts on this machine, registered in this cluster home."""


@lab.command("up")
@click.argument("n", type=click.IntRange(1, 64), default=2)
@click.option("--plain", is_flag=True, help="Hosts without systemd (always so without root).")
@click.option("--unprivileged", is_flag=True,
              help="Hosts that are only sshd processes of yours, not isolated (the default without root).")
@click.option("--dir", "lab_dir", metavar="DIR", help="Where the hosts live, outside /tmp (default: <home>/lab).")
@click.pass_context
def lab_up(ctx: click.Context, n: int, plain: bool, unprivileged: bool, lab_dir: str | None) -> None:
    """Start N practice hosts (default 2) and add them to xce.yaml as ssh hosts lab1..labN.

    As root each host has its own namespaces and sshd on a loopback address (systemd unless
    --plain); without root each is an sshd of yours on 127.0.0.1 and a port of its own.

    Example: xce lab up 2 --plain
    """
    from xce_lite.controller import daemon
    from xce_lite.home import lab

    home: Home = ctx.obj.require()
    started = lab.up(home, n, plain=plain, unprivileged=True if unprivileged else None, dir=lab_dir)
    running = daemon.lock_holder(home) is not None
    if running and not started.already:
        _client(ctx).post("/controller/reconfig", {})  # it connects the new hosts at once
    click.echo(lab.up_report(home, started, running))


@lab.command("down")
@click.pass_context
def lab_down(ctx: click.Context) -> None:
    """Stop the practice hosts and remove exactly their entries from xce.yaml and known_hosts.

    Example: xce lab down
    """
    from xce_lite.controller import daemon
    from xce_lite.home import lab

    home: Home = ctx.obj.require()
    stopped = lab.down(home)
    if stopped is None:
        click.echo("No lab is up in this home; `xce lab up` starts one.")
        return
    record, removed = stopped
    click.echo(f"Stopped the lab in {record.dir}; removed {', '.join(removed) or 'no host'} from xce.yaml.")
    if daemon.lock_holder(home) is not None:
        _client(ctx).post("/controller/reconfig", {})
        click.echo("The controller closed them to new work (jobs still running there are followed to their end).")


@lab.command("status")
@click.pass_context
def lab_status(ctx: click.Context) -> None:
    """Show each practice host: address, kind, pid, whether sshd answers. Exit 1 unless all are up.

    Example: xce lab status
    """
    from xce_lite.home import lab

    states = lab.status(ctx.obj.require())
    if not states:
        click.echo("No lab is up in this home; `xce lab up` starts one." if states is None else
                   "The lab recorded in this home has no host left; `xce lab down` clears what it left.")
        ctx.exit(1)
    for line in lab.status_lines(states):
        click.echo(line)
    ctx.exit(0 if all(s.up for s in states) else 1)


# ---- jobs -----------------------------------------------------------------------------------------


@main.command(context_settings={"allow_interspersed_args": False})
@submit_options
@click.option("--preset", metavar="NAME", help="Start from a saved preset's options (`xce preset list`); "
                                               "options given here win.")
@click.option("--parsable", is_flag=True, help="Print only the job id.")
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
@click.pass_context
def submit(ctx, preset, parsable, command, **options) -> None:
    """Submit CMD as a batch job. It runs as given, never through a shell: use `sh -c '...'` for one.

    The job gets a copy of this environment (as in LSF and Slurm) plus any --env, and its
    application profile's settings (-app; `xce apps -l` shows them).

    Example: xce submit -J sim -n 2,8 -R "rusage[mem=2G] span[ptile=4]" -W 30m -o out-%J.txt -- ./simulate
    """
    chosen = presets.load(preset) if preset is not None else None
    merged, from_preset = expand(given_options(ctx, options), chosen)
    spec = build_spec(merged, list(command), chosen, from_preset)
    reply = _client(ctx).post("/jobs", {"jobs": [spec]})
    job_id, queue_name, size = reply["ids"][0], reply["queues"][0], (reply.get("sizes") or [None])[0]
    array = f" (an array of {size} elements: {job_id}[index])" if size else ""
    click.echo(job_id if parsable else f"Job <{job_id}>{array} is submitted to queue <{queue_name}>.")


def _job_ids(values: tuple[str, ...]) -> list[str]:
    if not values:
        raise click.UsageError("name at least one job id")
    return list(values)


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
@click.pass_context
def wait(ctx, ids, timeout) -> None:
    """Wait until the jobs finish (an array: all its elements); exit 0 if all are DONE, 1 if any is EXIT.

    Example: xce wait 42 43
    """
    reply = _wait_for(_client(ctx), _job_ids(ids), timeout)
    _print_wait(reply)
    if not reply["finished"]:
        ctx.exit(EXIT_TIMEOUT)
    ctx.exit(0 if all(j["state"] == "DONE" for j in reply["jobs"]) else 1)


def _wait_for(client: Client, ids: list[int], timeout: float | None) -> dict:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
        reply = client.get("/jobs/wait", ids=",".join(map(str, ids)), timeout=left)
        if reply["finished"] or (deadline is not None and time.monotonic() >= deadline):
            return reply


def _print_wait(reply: dict) -> None:
    for job in reply["jobs"]:
        if job["state"] in ("DONE", "EXIT"):
            click.echo(f"Job <{display(job)}> {job['state']}: {outcome(job)}")
        else:
            click.echo(f"Job <{display(job)}> still {job['state']}")


@main.command()
@click.option("-f", "follow", is_flag=True, help="Keep showing what the job writes until it ends.")
@click.option("-e", "errors_file", is_flag=True, help="Show the job's error file (-e) instead of its output.")
@click.argument("job_id", type=int)
@click.pass_context
def peek(ctx, follow, errors_file, job_id) -> None:
    """Show a job's output so far, read on its first host (LSF's bpeek); -f follows it.

    Example: xce peek -f 42
    """
    import base64

    client = _client(ctx)
    offset = 0
    while True:
        reply = client.get("/jobs/peek", id=job_id, offset=offset, stream="err" if errors_file else "out")
        data = base64.b64decode(reply["data_b64"])
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        elif reply.get("message") and not follow:
            click.echo(reply["message"], err=True)
        offset = reply["offset"]
        if not follow or (reply["eof"] and reply["state"] in ("DONE", "EXIT")):
            return
        if reply["eof"]:
            time.sleep(0.5)


@main.command(context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
def launch(command) -> None:
    """From inside a job: run CMD once per task of the job, on every host it holds (LSF's blaunch),
    and exit with the worst exit code. Each copy sees XCE_TASK_INDEX and its host's XCE_HOST_NTASKS;
    its output goes to the job's output file on that host.

    Example: xce submit -n 8 -R "span[ptile=4]" -- xce launch -- ./worker
    """
    from xce_lite.exec.agent.launch import LaunchFailed, launch_tasks

    try:
        code = launch_tasks(list(command))
    except LaunchFailed as err:
        click.echo(f"xce launch: {err}", err=True)
        sys.exit(255)
    sys.exit(code if 0 <= code <= 255 else 255)


@main.command()
@click.argument("job_id")
@click.pass_context
def why(ctx, job_id) -> None:
    """Say why a pending job waits: per host and per resource, tried against the cluster as it is now
    (or the dependency it waits for). JOB_ID: 42, or 42[7] for an array element.

    Example: xce why 42
    """
    reply = _client(ctx).get("/jobs/why", id=job_id)
    click.echo(f"Job <{job_id}> {reply['state']}" + (f": {reply['summary']}" if reply.get("summary") else ""))
    for line in reply["lines"]:
        click.echo(f"  {line}")
    if reply.get("effective"):
        click.echo("  What it asks for [where from]:")
        for line in effective_lines(reply["effective"]):
            click.echo(line)


def _act(ctx, path: str, ids: tuple[str, ...], **extra) -> None:
    reply = _client(ctx).post(path, {"ids": _job_ids(ids), **extra})
    failed = False
    for result in reply["results"]:
        click.echo(result["message"], err=not result["ok"])
        failed |= not result["ok"]
    if failed:
        ctx.exit(1)


# Commands that act on jobs by id, all alike: (name, API path, help with its example).
_ACTIONS = (
    ("kill", "/jobs/kill", "Kill jobs: pending ones end at once, running ones get TERM, then KILL after the "
                           "grace time."),
    ("hold", "/jobs/hold", "Hold pending jobs (PEND -> PSUSP) so the scheduler leaves them alone."),
    ("release", "/jobs/release", "Release held jobs (PSUSP -> PEND)."),
    ("suspend", "/jobs/suspend", "Suspend running jobs (RUN -> USUSP, LSF's bstop): their processes get SIGSTOP."),
    ("resume", "/jobs/resume", "Resume suspended jobs (USUSP -> RUN, LSF's bresume): their processes get "
                               "SIGCONT."),
)
_ACTION_IDS = "IDS: 42 (a job, or a whole array), 42[7] (one element of array 42)."


def _action_command(name: str, path: str, text: str) -> click.Command:
    @click.argument("ids", nargs=-1)
    @click.pass_context
    def command(ctx, ids) -> None:
        _act(ctx, path, ids)

    command.__doc__ = f"{text} {_ACTION_IDS}\n\n    Example: xce {name} 42 43[7]\n    "
    return main.command(name)(command)


for _name, _path, _text in _ACTIONS:
    _action_command(_name, _path, _text)


@main.command()
@click.option("--hold", is_flag=True, help="Requeue it held (PSUSP): `xce release` lets it run again.")
@click.argument("ids", nargs=-1)
@click.pass_context
def requeue(ctx, hold, ids) -> None:
    """Send dispatched or running jobs back to the queue (LSF's brequeue): their processes are
    stopped, and each job keeps its id and submit time and runs again as its next attempt.

    Example: xce requeue 42 --hold
    """
    _act(ctx, "/jobs/requeue", ids, hold=hold)


@main.group(invoke_without_command=True)
@click.option("-l", "long", is_flag=True, help="Per resource: total, reserved and free; GPUs, attributes, tags.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_context
def hosts(ctx, long, as_json) -> None:
    """List the hosts with their state and slots (`xce hosts add` adds one).

    Example: xce hosts -l
    """
    if ctx.invoked_subcommand is not None:
        return
    reply = _client(ctx).get("/hosts")
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    if long:
        for h in reply["hosts"]:
            click.echo(f"HOST {h['name']}  ({h['type']}, {_host_status(h)}, {h['jobs']} jobs)")
            if h.get("unreach_why"):
                click.echo(f"  out of reach: {h['unreach_why']}")
            click.echo(f"  {_agent_line(h.get('agent'))}")
            rows = [("RESOURCE", "TOTAL", "RESERVED", "FREE")]
            for name, r in sorted(h["resources"].items()):
                rows.append((name, *(_amount(name, r[k]) for k in ("total", "reserved", "free"))))
            _table(rows)
            extra = [f"gpus free: {','.join(map(str, h['gpus_free']))}" if h["gpus_free"] else "",
                     " ".join(f"{k}={v}" for k, v in sorted(h["attrs"].items())),
                     f"tags: {' '.join(h['tags'])}" if h["tags"] else ""]
            click.echo("  ".join(e for e in extra if e) + "\n")
        return
    rows = [("HOST_NAME", "STATUS", "MAX", "NJOBS", "RUN", "MEM", "MODE")]
    for h in reply["hosts"]:
        mode = (h.get("agent") or {}).get("mode") or "-"
        rows.append((h["name"], h["state"], str(h["slots"]), str(h["used"]), str(h["jobs"]), format_size(h["mem"]),
                     mode))
    _table(rows)


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
    fields = {"address": address, "port": port, "user": user, "identity": identity, "python": python,
              "launch": launch}
    added = add_host(home, name, fields, slots=slots, mem=mem, accept_new=accept_new, dry_run=dry_run)
    probe = added.probe
    agent = {"hostname": probe.hostname, "cpus": probe.cpus, "mem": probe.mem, "version": probe.agent_version,
             **probe.extra}
    click.echo(f"Host {name} answers: {_agent_line(agent)}")
    if not added.entry:
        click.echo(f"Host {name} was in {home.config} already: its host key is trusted now.")
        if daemon.lock_holder(home) is not None:
            _client(ctx).post("/hosts/reconnect", {"names": [name]})
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
    _client(ctx).post("/controller/reconfig", {})
    click.echo("The controller is connecting to it now; `xce hosts` shows when it is ok.")


def _host_status(h: dict) -> str:
    if h["state"] == "ok" or not h.get("unreach_since"):
        return h["state"]
    return f"{h['state']} since {when(h['unreach_since'])}" + ("; lost: its jobs were requeued or ended"
                                                                 if h.get("lost") else "")


_MODE_WORDS = {"systemd": "systemd system units", "user": "systemd user units", "plain": "the plain supervisor"}


def _agent_line(agent: dict | None) -> str:
    """How the host runs jobs, as its agent said when it last connected."""
    if not agent:
        return "agent: not connected yet"
    mode = agent.get("mode") or "plain"
    words = [f"jobs run under {_MODE_WORDS.get(mode, mode)}", f"agent v{agent['version']} on {agent['hostname']}",
             f"{agent['cpus']} cpus", format_size(agent["mem"])]
    if agent.get("load"):
        words.append("load " + " ".join(f"{x:.2f}" for x in agent["load"]))
    if agent.get("gpus"):
        words.append(f"{len(agent['gpus'])} gpus")
    lines = ["agent: " + ", ".join(words)]
    for other, info in sorted((agent.get("modes") or {}).items()):
        if other != mode and isinstance(info, dict) and not info.get("ok") and info.get("why"):
            lines.append(f"  no {_MODE_WORDS.get(other, other)}: {info['why']}")
    return "\n  ".join(lines)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_context
def queues(ctx, as_json) -> None:
    """List the queues with their priority and jobs.

    Example: xce queues
    """
    reply = _client(ctx).get("/queues")
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    rows = [("QUEUE_NAME", "PRIO", "DEFAULT", "PEND", "RUN", "DESCRIPTION")]
    for q in reply["queues"]:
        rows.append((q["name"], str(q["priority"]), "yes" if q["default"] else "", str(q["pend"]), str(q["run"]),
                     q["description"]))
    _table(rows)


def _amount(name: str, value: float) -> str:
    if name == "mem":
        return format_size(int(value)) if value > 0 else "0"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _table(rows: list[tuple[str, ...]]) -> None:
    for line in table_lines(rows):
        click.echo(line)


main.add_command(jobs)
main.add_command(flow_group)
main.add_command(apps)
main.add_command(reconfig)
main.add_command(preset_group)
main.add_command(sim_group)
main.add_command(web_command)
main.add_command(metrics_command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
