"""Tasks of `xce launch` (a part of the Agent, server.py): the jobs' requests on SPOOL/agent.sock
(launch, launch_wait; and supervisors' pokes), the controller's `tasks` and `launch_done`.

A job's connection is only read when poll() says so and only written with short lines into an
empty socket buffer: the serve loop never blocks on a job.
"""

from __future__ import annotations

import os
import sys

from .jsonl import dumps, loads
from .runas import JOB_DIR
from .signals import TASKS_SIGNAL
from .util import unix_address, write_file
from .validate import Refused, check_argv_env, valid_unit_name, validate_tasks

TYPE_CHECKING = False  # true for mypy only: see shared.py
if TYPE_CHECKING:
    from .manager import Manager
    from .shared import AgentState
    from .state import UnitState
    from .unitops import UnitOps


class Client:
    """A connection to SPOOL/agent.sock: a supervisor's poke, or `xce launch` waiting for its tasks."""

    __slots__ = ("buf", "sock", "uid")

    def __init__(self, sock, uid: int):
        self.sock, self.buf = sock, bytearray()
        self.uid = uid  # the caller's, as the kernel says (SO_PEERCRED)


class TaskOps:
    """The tasks and launch_done requests, and the jobs' connections to agent.sock: a unit's state
    from `unit_state`, a task's env as `unit_ops` makes a job's, a direct unit's tasks' supervisor
    from `manager`."""

    def __init__(self, state: AgentState, unit_state: UnitState, unit_ops: UnitOps, manager: Manager):
        self.state, self.unit_state, self.unit_ops, self.manager = state, unit_state, unit_ops, manager

    def op_tasks(self, req: dict) -> dict:
        """Start tasks of `xce launch` inside a running unit: written to its host directory, and its
        supervisor told with TASKS_SIGNAL (a direct unit, which has none, gets a tasks' supervisor:
        fork_tasks). Each end is a task_finished event."""
        s = self.state
        validate_tasks(req)
        unit, launch_id = req["unit"], req["launch_id"]
        self.unit_state.catch_up()
        status = self.unit_state.unit_status(unit)
        if status is None or status[0] != "running":
            raise Refused(f"unit {unit} is not running on this host, so its tasks cannot start")
        host_dir = os.path.join(s.units_dir, unit)
        job_dir = os.path.join(host_dir, JOB_DIR)  # a job run as another user has its own (runas.py)
        job_dir = job_dir if os.path.isdir(job_dir) else host_dir
        hostfile = os.path.exists(os.path.join(job_dir, "hostfile"))
        tasks = [
            {"index": t["index"], "argv": t["argv"], "cwd": t["cwd"],
             "env": self.unit_ops.job_env(t["env"], unit, job_dir, hostfile)}
            for t in req["tasks"]
        ]
        try:
            os.makedirs(host_dir, exist_ok=True)  # plain mode: its supervisor may not have made it yet
            batch = dumps({"launch_id": launch_id, "tasks": tasks})
            write_file(os.path.join(host_dir, f"tasks-{launch_id}.json"), batch)
        except OSError as exc:
            raise Refused(f"cannot hand the tasks to unit {unit} in {host_dir}: {exc.strerror}") from None
        if s.units[unit].direct is not None:
            self.manager.fork_tasks(unit, s.units[unit])
        else:
            self.unit_state.deliver(unit, status[3], TASKS_SIGNAL)
        return {"accepted": len(tasks)}

    def op_launch_done(self, req: dict) -> dict:
        """Answer the `xce launch` waiting for `launch_id` with `exit_code` (or keep the answer
        for it, if it is not connected now)."""
        s = self.state
        launch_id, code = req.get("launch_id"), req.get("exit_code")
        if not valid_unit_name(launch_id) or not isinstance(code, int) or isinstance(code, bool):
            raise Refused(f"launch_done needs a launch_id and an integer exit_code, not {launch_id!r}, {code!r}")
        fd = s.waiting.pop(launch_id, None)
        if fd is not None and fd in s.clients:
            delivered = self.send_client(fd, {"exit_code": code})
            self.close_client(fd)
            if delivered:
                return {"delivered": True}
        s.launch_codes[launch_id] = code
        while len(s.launch_codes) > 1000:  # answers nobody came back for
            del s.launch_codes[next(iter(s.launch_codes))]
        return {"delivered": False}

    def open_socket(self) -> None:
        """Listen on SPOOL/agent.sock (0600). Without it the agent still serves: supervisors'
        pokes are replaced by polling, and `xce launch` says it cannot reach the agent."""
        s = self.state
        import socket

        try:
            os.unlink(s.sock_path)  # a dead agent's: we hold the spool lock
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"agent: cannot remove {s.sock_path}: {exc}", file=sys.stderr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            address, fd = unix_address(s.sock_path)
            try:
                sock.bind(address)
            finally:
                if fd >= 0:
                    os.close(fd)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            print(f"agent: cannot listen on {s.sock_path} ({exc}): `xce launch` will not work", file=sys.stderr)
            return
        finally:
            os.umask(old_umask)
        sock.setblocking(False)
        s.listener = sock
        if s.spool_shared:  # jobs run as other users may call: who calls is checked (may_launch)
            os.chmod(s.sock_path, 0o666)

    def accept_clients(self) -> None:
        s = self.state
        import socket
        import struct

        listener = s.listener
        if listener is None:  # open_socket() failed: no job can call
            return
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the jobs retry, pokes are only hints
                print(f"agent: accept on {s.sock_path} failed: {exc}", file=sys.stderr)
                return
            conn.setblocking(False)
            try:
                _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            except OSError:
                uid = -1  # nobody: may neither launch nor poke with authority
            s.clients[conn.fileno()] = Client(conn, uid)
            if s.poller is not None:  # serve() made it before it listens
                s.poller.register(conn.fileno(), 1)  # POLLIN

    def read_client(self, fd: int) -> None:
        s = self.state
        client = s.clients.get(fd)
        if client is None:
            return
        try:
            data = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close_client(fd)
            return
        client.buf += data
        *lines, rest = client.buf.split(b"\n")
        client.buf = bytearray(rest)
        for line in lines:
            if line.strip() and fd in s.clients:
                self.handle_client_line(fd, line)

    def handle_client_line(self, fd: int, line: bytes | bytearray) -> None:
        s = self.state
        try:
            msg = loads(line)
            op = msg["op"]
        except (ValueError, KeyError, TypeError) as exc:
            self.send_client(fd, {"error": f"unreadable request ({exc})"})
            self.close_client(fd)
            return
        own = s.clients[fd].uid == os.geteuid()  # the agent's user: its supervisors, `post`, a new agent
        if op == "poke":
            synced = msg.get("synced") if own else None
            if isinstance(synced, list) and len(synced) == 2 and synced[0] == os.fstat(s.jfd).st_ino:
                s.synced = max(s.synced, int(synced[1]))  # `post` fdatasync'ed up to there
            self.unit_state.catch_up()
            if own and msg.get("handover") and (s.orphan or s.lease_acted):
                s.handover = True  # a new agent waits for the spool (main.take_spool_lock), and
                # no controller keeps this one (it went away, or its lease ran out): leave
        elif op == "launch":
            self.client_launch(fd, msg)
        elif op == "launch_wait":
            launch_id = msg.get("launch_id")
            if not isinstance(launch_id, str) or not self.may_launch(fd, launch_id.rpartition(".")[0]):
                self.send_client(fd, {"error": f"launch {launch_id!r} is not of a job of yours"})
                self.close_client(fd)
            elif launch_id in s.launch_codes:
                self.send_client(fd, {"exit_code": s.launch_codes.pop(launch_id)})
                self.close_client(fd)
            else:
                s.waiting[launch_id] = fd
        else:
            self.send_client(fd, {"error": f"unknown request {op!r}: this agent takes launch, launch_wait, poke"})
            self.close_client(fd)

    def client_launch(self, fd: int, msg: dict) -> None:
        """`xce launch` from a job: tell the controller, which sends `tasks` to the job's hosts and
        `launch_done` here when all have ended."""
        s = self.state
        unit, argv, env, cwd = msg.get("unit"), msg.get("argv"), msg.get("env"), msg.get("cwd")
        try:
            if not valid_unit_name(unit):
                raise Refused(f"bad unit {unit!r} (XCE_UNIT)")
            check_argv_env(argv, env)
            if not isinstance(cwd, str) or not os.path.isabs(cwd):
                raise Refused(f"cwd must be an absolute path, not {cwd!r}")
            self.unit_state.catch_up()
            status = self.unit_state.unit_status(unit)
            if status is None or status[0] != "running":
                raise Refused(f"unit {unit} is not running on this host")
            if not self.may_launch(fd, unit):
                raise Refused(f"unit {unit} is not a job of yours: only its user may launch its tasks")
        except Refused as exc:
            self.send_client(fd, {"error": str(exc)})
            self.close_client(fd)
            return
        launch_id = f"{unit}.{os.urandom(6).hex()}"
        s.waiting[launch_id] = fd
        self.send_client(fd, {"launch_id": launch_id})
        event = {"event": "launch_requested", "launch_id": launch_id, "unit": unit}
        s.out.append(dumps({**event, "argv": argv, "env": env, "cwd": cwd}))

    def may_launch(self, fd: int, unit: str) -> bool:
        """Whether the caller on `fd` may launch (or wait for) tasks of `unit`: the agent's user (root
        too, in a shared spool), or the user the unit runs as."""
        s = self.state
        uid = s.clients[fd].uid
        u = s.units.get(unit)
        return uid == os.geteuid() or (u is not None and u.uid is not None and uid == u.uid)

    def send_client(self, fd: int, msg: dict) -> bool:
        client = self.state.clients.get(fd)
        if client is None:
            return False
        try:
            client.sock.send(dumps(msg))  # a short line into an empty socket buffer: never blocks
            return True
        except OSError:
            return False

    def close_client(self, fd: int) -> None:
        s = self.state
        client = s.clients.pop(fd, None)
        if client is None:
            return
        if s.poller is not None:
            s.poller.unregister(fd)
        client.sock.close()
        for launch_id in [k for k, v in s.waiting.items() if v == fd]:
            del s.waiting[launch_id]  # its `xce launch` comes back with launch_wait
