"""AgentChannel.corked (issue 18): the lines nobody waits for are held until the block ends and go
in ONE write (counted by the kernel: the thread's write syscalls, /proc/thread-self/io); a request
that waits for its reply goes at once with the held lines before it, from the corking thread or
another, so nothing waits on a line still held; a channel lost meanwhile fails as without a cork."""

from __future__ import annotations

import json
import os
import queue
import select
import threading
from collections.abc import Iterator

import pytest

from xce_lite.errors import HostUnreachable
from xce_lite.exec.channel import AgentChannel
from xce_lite.exec.host import HostLost


class Pipes:
    """A channel wired to pipes whose other ends the test plays (the agent's stdin and stdout)."""

    def __init__(self) -> None:
        r1, w1 = os.pipe()  # channel -> agent
        r2, w2 = os.pipe()  # agent -> channel
        self.agent_in, self.agent_out = os.fdopen(r1, "rb"), os.fdopen(w2, "wb", buffering=0)
        self.events: queue.Queue = queue.Queue()
        self.channel = AgentChannel(os.fdopen(r2, "rb"), os.fdopen(w1, "wb"), self.events.put, "fake", 5.0)

    def waiting(self) -> bool:
        """Whether a line waits for the agent to read it."""
        return bool(select.select([self.agent_in], [], [], 0)[0])

    def lines(self, n: int) -> list[dict]:
        return [json.loads(self.agent_in.readline()) for _ in range(n)]

    def answer(self, request: dict) -> None:
        self.agent_out.write(json.dumps({"id": request["id"], "ok": True}).encode() + b"\n")

    def close(self) -> None:
        self.agent_out.close()
        self.channel.close()
        self.agent_in.close()


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    p = Pipes()
    yield p
    p.close()


def writes() -> int:
    """This thread's write syscalls so far."""
    with open("/proc/thread-self/io") as f:
        return int(next(line for line in f if line.startswith("syscw:")).split()[1])


def test_lines_sent_without_waiting_go_in_one_write_when_the_block_ends(pipes: Pipes) -> None:
    replies: list = []
    before = writes()
    with pipes.channel.corked():
        pipes.channel.request_nowait("launch", lambda reply, error: replies.append((reply, error)), units=["u1"])
        pipes.channel.send("forget", units=["u0"])
        with pipes.channel.corked():  # nested: one block
            pipes.channel.send("forget", units=["u00"])
        assert not pipes.waiting() and writes() == before
    assert writes() == before + 1
    launch, forget, forget2 = pipes.lines(3)
    assert (launch["op"], launch["units"], forget["op"], forget["units"], forget2["units"]) == \
        ("launch", ["u1"], "forget", ["u0"], ["u00"])
    pipes.answer(launch)  # the held request's reply reaches its callback as before
    deadline = threading.Event()
    for _ in range(100):
        if replies:
            break
        deadline.wait(0.05)
    assert replies and replies[0][0]["ok"] is True and replies[0][1] is None
    # and without a block, each line is its own write, as before
    before = writes()
    pipes.channel.send("forget", units=["u2"])
    pipes.channel.send("forget", units=["u3"])
    assert writes() == before + 2 and [line["units"] for line in pipes.lines(2)] == [["u2"], ["u3"]]


@pytest.mark.parametrize("where", ["the corking thread", "another thread"])
def test_a_request_that_waits_goes_at_once_after_the_held_lines(pipes: Pipes, where: str) -> None:
    seen: list[dict] = []

    def agent() -> None:  # reads what reaches it, answers the request that waits
        seen.extend(pipes.lines(2))
        pipes.answer(seen[1])

    reader = threading.Thread(target=agent)
    reader.start()
    with pipes.channel.corked():
        pipes.channel.send("forget", units=["u0"])
        if where == "the corking thread":
            reply = pipes.channel.request("list")
        else:
            got: list[dict] = []
            asker = threading.Thread(target=lambda: got.append(pipes.channel.request("list")))
            asker.start()
            asker.join(10)
            reply = got[0]
        assert reply["ok"] is True  # answered while the block still runs
    reader.join(10)
    assert [line["op"] for line in seen] == ["forget", "list"]
    assert not pipes.waiting()  # nothing was left held


def test_a_channel_lost_while_corked_fails_the_held_requests_once(pipes: Pipes) -> None:
    errors: list = []
    with pipes.channel.corked():
        pipes.channel.request_nowait("launch", lambda reply, error: errors.append(error), units=["u1"])
        pipes.agent_out.close()  # the agent's output ends: the channel is lost
        lost = pipes.events.get(timeout=5)
        assert isinstance(lost, HostLost)
        with pytest.raises(HostUnreachable):
            pipes.channel.send("forget", units=["u0"])
    assert len(errors) == 1 and isinstance(errors[0], HostUnreachable)
    assert pipes.events.empty()


def test_a_heartbeat_ping_goes_out_while_a_cork_is_held() -> None:
    """The heartbeat thread's ping waits for its reply: held by a cork that a stalled block (another
    host's write) keeps open, it would starve this healthy host into HostLost."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    agent_in, agent_out = os.fdopen(r1, "rb"), os.fdopen(w2, "wb", buffering=0)
    events: queue.Queue = queue.Queue()
    channel = AgentChannel(os.fdopen(r2, "rb"), os.fdopen(w1, "wb"), events.put, "fake", 5.0,
                           heartbeat=0.05, heartbeat_timeout=2.0)
    try:
        with channel.corked():
            channel.send("forget", units=["u0"])  # held, and goes out with the ping
            ready = select.select([agent_in], [], [], 10)[0]
            assert ready, "no ping reached the agent while the cork was held"
            forget, ping = json.loads(agent_in.readline()), json.loads(agent_in.readline())
            assert (forget["op"], ping["op"]) == ("forget", "ping")
            agent_out.write(json.dumps({"id": ping["id"], "ok": True}).encode() + b"\n")
        assert not any(isinstance(e, HostLost) for e in list(events.queue))
    finally:
        agent_out.close()
        channel.close()
        agent_in.close()
