"""Setting a cluster up: `xce init`, `xce quickstart`, `xce examples copy`, `xce controller ...` and
`xce lab ...`. Thin, like every command module; light at import (click and the standard library).

`init` writes nothing until the cluster name is known to be free and valid (home/clusters.py): a
refused init leaves no file behind.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from xce_lite import errors
from xce_lite.api.client import Client
from xce_lite.cli.base import JSON_OPTION, Seconds, client, echo_json
from xce_lite.home.paths import Home

QUICKSTART_DONE = ("Next: the tour in README.md (\"A five-minute tour\"); `xce examples copy ~/xce-tour` gives "
                   "its files.")


@click.command()
@click.argument("dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--cluster", metavar="NAME",
              help="The cluster's name (part of unit names on the hosts). Default: one that no other cluster home "
                   "on this machine uses (xce, xce2, ...).")
@click.option("--shared", is_flag=True,
              help="A shared lab's home: one controller, run by root, for every user; jobs run as their submitter. "
                   "Default DIR: /var/lib/xce_lite.")
@click.option("--admin", "admins", multiple=True, metavar="NAME",
              help="With --shared: a user who may act on every job, or @GROUP for a group's members (repeat it). "
                   "Default: the user who ran sudo.")
@click.option("--socket-group", metavar="GROUP",
              help="With --shared: only this group's members reach the controller (default: every local user).")
@click.option("--visibility", type=click.Choice(["full", "summary"]), default="full", show_default=True,
              help="With --shared: what users see of others' jobs (summary: no command line, env, cwd, output paths).")
@click.option("--register", is_flag=True,
              help="With --shared: make it this machine's default home (/etc/xce_lite/home), so users need no "
                   "XCE_HOME.")
@click.pass_context
def init(ctx: click.Context, dir: Path | None, cluster: str | None, shared: bool, admins: tuple[str, ...],
         socket_group: str | None, visibility: str, register: bool) -> None:
    """Create a cluster home with an xce.yaml for a one-host cluster on this machine.

    In DIR, else the home --home or XCE_HOME names, else ~/.xce; with --shared, a lab's home for
    every user of this machine (README "A shared lab"; default DIR /var/lib/xce_lite).

    Example: xce init && xce controller start
    """
    home: Home = ctx.obj
    if dir is not None:
        home = Home(Path(os.path.abspath(dir)))
    elif shared and home.via in ("personal", "machine"):
        from xce_lite.home.shared import DEFAULT_ROOT

        home = Home(DEFAULT_ROOT)
    else:
        home = home.personal()  # a lab user's own cluster never lands in the machine's default home
    if not shared:
        given = [name for name, value in (("--admin", admins), ("--socket-group", socket_group),
                                          ("--register", register)) if value]
        if given:
            raise click.UsageError(f"{', '.join(given)} go with --shared")
        init_home(home, cluster)
        return
    init_shared(home, cluster, list(admins), socket_group, visibility, register)


def init_home(home: Home, cluster: str | None, shared_block: str | None = None) -> None:
    from xce_lite.config.cluster import load_config
    from xce_lite.config.init_file import default_config_text, detect_memory
    from xce_lite.home import clusters
    from xce_lite.home.shared import with_shared_block

    if home.config.exists():
        raise errors.HomeError(f"{home.config} already exists; edit it, or choose another home with --home")
    if cluster is not None:
        clusters.check(cluster, home.root)
    home.make_private(shared=False)  # a shared home opens (0711) only once its xce.yaml is whole
    name = cluster if cluster is not None else clusters.pick(home.root)
    host = os.uname().nodename.split(".")[0]
    text = default_config_text(name, host, os.cpu_count() or 1, detect_memory())
    if shared_block is not None:
        text = with_shared_block(text, shared_block)
    tmp = home.config.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o600)  # the home is private (paths.py); edits keep this mode (config_edit.py)
    try:
        load_config(tmp)  # what we wrote must load: fail here, not at controller start
    except errors.XceError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, home.config)
    clusters.claim(name, home.root)
    taken = "" if cluster is not None or name == clusters.BASE else \
        f" ({clusters.BASE} is taken by {clusters.owner(clusters.BASE, home.root) or 'another home'})"
    click.echo(f"Created {home.config}: cluster {name}{taken}, one host, {os.cpu_count()} slots, queue normal"
               f"{', shared' if shared_block is not None else ''}.")
    if shared_block is None:
        click.echo("Next: `xce controller start`, then `xce submit -- echo hello`.")


def init_shared(home: Home, cluster: str | None, admins: list[str], socket_group: str | None, visibility: str,
                register: bool) -> None:
    """`xce init --shared`: every check first (home/shared.py), then the home, then the default file."""
    from xce_lite.home import shared

    shared.check_root()
    if not admins:
        admins = shared.default_admins()
    if not admins and click.get_text_stream("stdin").isatty():
        answer = click.prompt("Who administers this lab (user names or @group, separated by spaces)?")
        admins = answer.replace(",", " ").split()
    shared.check_admins(admins)
    shared.check_group(socket_group)
    shared.check_reachable(home.root)
    if register:
        shared.check_register(home)
    if home.root.parent != home.root:
        home.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    init_home(home, cluster, shared.config_block(admins, socket_group, visibility))
    shared.finish(home)
    click.echo(f"Admins: {', '.join(admins)}; the socket {home.socket} is open to "
               f"{'the members of group ' + socket_group if socket_group else 'every local user'}.")
    if register:
        click.echo(f"Registered it as this machine's default home in {shared.register(home)}: users need no XCE_HOME.")
    else:
        click.echo(f"Users reach it with XCE_HOME={home.root}, or make it the machine's default: "
                   f"{shared.register_hint(home)}")
    click.echo(f"Next: start its controller as root: `xce --home {home.root} controller start`, or at boot: "
               f"`xce --home {home.root} controller unit` prints a systemd unit.")


@click.command()
@click.pass_context
def quickstart(ctx: click.Context) -> None:
    """Create the home if needed, start the controller, run an example job and show its output.

    Example: pip install . && xce quickstart
    """
    from xce_lite.cli.waiting import wait_for, print_final
    from xce_lite.controller import daemon

    home: Home = ctx.obj.personal()  # never the machine's shared default: a cluster of one's own
    if not home.config.exists():
        init_home(home, None)
    if daemon.lock_holder(home) is None:
        pid = daemon.start_detached(home.require())
        click.echo(f"Controller started (pid {pid}), serving {home.socket}.")
    api = Client(home.socket)
    ctx.call_on_close(api.close)
    out = home.root / "quickstart.out"
    spec = {"argv": ["sh", "-c", 'echo "hello from job $XCE_JOBID on $(hostname)"'], "cwd": str(home.root),
            "name": "quickstart", "stdout": str(out), "env": dict(os.environ)}
    job_id = api.post("/jobs", {"jobs": [spec]})["ids"][0]
    click.echo(f"Job <{job_id}> is submitted to queue <normal>.")
    print_final(wait_for(api, [str(job_id)], timeout=60))
    click.echo(f"Its output ({out}):")
    click.echo(out.read_text(errors="replace").rstrip())
    click.echo("\n" + QUICKSTART_DONE)


# ---- the examples ---------------------------------------------------------------------------------


@click.group()
def examples() -> None:
    """The example scripts, flows, cluster configs and workloads shipped with xce_lite."""


@examples.command("copy")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files you changed since an earlier copy.")
def examples_copy(dest: Path, force: bool) -> None:
    """Copy the examples into DEST (made if missing). Safe to repeat: identical files are left
    alone, and a file you changed is kept unless --force.

    Example: xce examples copy ~/xce-tour && cd ~/xce-tour
    """
    from xce_lite.home.examples import copy_examples

    if not str(dest).strip():
        raise click.BadParameter("the directory is empty; name one, e.g. ~/xce-tour", param_hint="DEST")
    copied, same, kept = copy_examples(dest, force)
    click.echo(f"Copied {len(copied)} example file(s) into {dest}" + (f" ({len(same)} already there)" if same else "")
               + ".")
    for name in kept:
        click.echo(f"Kept your changed {dest / name} (--force replaces it).")


# ---- the controller -------------------------------------------------------------------------------


@click.group()
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
        from xce_lite.controller.foreground import run_foreground

        run_foreground(home)
        return
    from xce_lite.controller import daemon

    pid = daemon.start_detached(home)
    click.echo(f"Controller started (pid {pid}), serving {home.socket}; log: {home.log}")


@controller.command("stop")
@click.pass_context
def controller_stop(ctx: click.Context) -> None:
    """Stop the controller. Running jobs go on (each host first gets the maintenance lease,
    `controller.maintenance_lease`, default 1h: a job still running when it runs out is stopped);
    the next start adopts them.

    Example: xce controller stop
    """
    from xce_lite.controller import daemon

    pid = daemon.stop(ctx.obj.require())
    click.echo("No controller was running." if pid is None else f"Controller (pid {pid}) stopped.")


@controller.command("status")
@JSON_OPTION
@click.option("--wait", "wait_s", type=Seconds(min=0, max=3600), default=0, metavar="SECONDS",
              help="Wait up to SECONDS for it to answer (a controller just started; the unit's ExecStartPost).")
@click.pass_context
def controller_status(ctx: click.Context, as_json: bool, wait_s: float) -> None:
    """Say whether the controller runs, and what it holds. Exit 3 if it does not run.

    Example: xce controller status
    """
    from xce_lite.controller.daemon import read_fault

    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                status = client(ctx).get("/status")
                break
            except errors.ControllerDown:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)  # polled: a starting controller says nothing until its socket answers
    except errors.ControllerDown as err:
        fault = read_fault(ctx.obj)
        if not as_json:
            if fault is not None:  # why it stopped, which the next start shows too
                raise errors.ControllerDown(f"{err}\nIt stopped on a fault at {_clock(fault.get('time'))}: "
                                            f"{fault['why']}") from None
            raise
        echo_json({"schema": 1, "running": False, "home": str(ctx.obj.root), "previous_fault": fault})
        ctx.exit(errors.ControllerDown.exit_code)
    if as_json:
        echo_json({"schema": 1, "running": True, **status})
        return
    jobs = status["jobs"]
    click.echo(f"Controller of cluster {status['cluster']} is running (pid {status['pid']}) at "
               f"{status['home']}: {jobs['pending']} pending, {jobs['held']} held, {jobs['active']} running.")
    for problem in status.get("problems", []):
        click.echo(f"Problem since {_clock(problem.get('since'))}: {problem['message']}.")
    fault = status.get("previous_fault")
    if fault:
        click.echo(f"Its previous run stopped on a fault at {_clock(fault.get('time'))}: {fault['why']}")


@controller.command("unit")
@click.pass_context
def controller_unit(ctx: click.Context) -> None:
    """Print a systemd unit that runs this home's controller at boot and restarts it on failure
    (a shared home's, as root; install it as /etc/systemd/system/xce-controller.service).

    Example: xce --home /var/lib/xce_lite controller unit > /etc/systemd/system/xce-controller.service
    """
    from xce_lite.home.unit import unit_for

    click.echo(unit_for(ctx.obj.require()), nl=False)


def _clock(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp else "?"


# ---- the practice cluster --------------------------------------------------------------------------


@click.group()
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
    from xce_lite.home import lab as labs

    home: Home = ctx.obj.require()
    if lab_dir is not None and not lab_dir.strip():
        raise click.BadParameter("the directory is empty; leave --dir out for the default", param_hint="--dir")
    started = labs.up(home, n, plain=plain, unprivileged=True if unprivileged else None, dir=lab_dir)
    running = daemon.lock_holder(home) is not None
    if running and not started.already:
        client(ctx).post("/controller/reconfig", {})  # it connects the new hosts at once
    click.echo(labs.up_report(home, started, running))


@lab.command("down")
@click.pass_context
def lab_down(ctx: click.Context) -> None:
    """Stop the practice hosts and remove exactly what `up` made: their entries in xce.yaml and
    known_hosts, and their agents' directories (~/.xce-agent/CLUSTER-labN).

    Example: xce lab down
    """
    from xce_lite.controller import daemon
    from xce_lite.home import lab as labs

    home: Home = ctx.obj.require()
    stopped = labs.down(home)
    if stopped is None:
        click.echo("No lab is up in this home; `xce lab up` starts one.")
        return
    record, removed = stopped
    click.echo(f"Stopped the lab in {record.dir}; removed {', '.join(removed) or 'no host'} from xce.yaml.")
    if daemon.lock_holder(home) is not None:
        client(ctx).post("/controller/reconfig", {})
        click.echo("The controller closed them to new work (jobs still running there are followed to their end).")


@lab.command("status")
@JSON_OPTION
@click.pass_context
def lab_status(ctx: click.Context, as_json: bool) -> None:
    """Show each practice host: address, kind, pid, whether sshd answers. Exit 1 unless all are up.

    Example: xce lab status
    """
    from xce_lite.home import lab as labs

    states = labs.status(ctx.obj.require())
    if as_json:
        echo_json({"schema": 1, "lab": states is not None, "hosts": [
            {"name": s.host.name, "address": s.host.ip, "port": s.host.port, "mode": s.host.mode, "pid": s.host.pid,
             "alive": s.alive, "sshd": s.sshd, "up": s.up, "registered": s.registered} for s in states or ()]})
        ctx.exit(0 if states and all(s.up for s in states) else 1)
    if not states:
        click.echo("No lab is up in this home; `xce lab up` starts one." if states is None else
                   "The lab recorded in this home has no host left; `xce lab down` clears what it left.")
        ctx.exit(1)
    for line in labs.status_lines(states):
        click.echo(line)
    ctx.exit(0 if all(s.up for s in states) else 1)
