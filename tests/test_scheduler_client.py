"""The HTTP process's scheduler client over real ZMQ sockets, with this test standing in for
the scheduler and the detokenizer: updates reach the request they were made for, even when a
client aborts a request and sends its ``rid`` again before the backend's last word on the
first one arrives."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest
import zmq

from runtime import ipc
from runtime.ipc.messages import AbortReq, BatchStrOut, StrUpdate, TokenizedGenerateReq, TokenUpdate
from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.server.metrics import ServerMetrics
from runtime.server.request_log import RequestLog
from runtime.server.scheduler_client import ReqState, SchedulerClient


def _update(wire_id: str, ids: list[int], finished: dict | None = None) -> BatchStrOut:
    token = TokenUpdate(wire_id, len(ids), finished, prompt_tokens=3, cached_tokens=0, completion_tokens=len(ids))
    return BatchStrOut([StrUpdate(token, "x" * len(ids))], np.asarray(ids, dtype=np.int32))


@contextlib.asynccontextmanager
async def _backend() -> AsyncIterator[tuple[SchedulerClient, zmq.Socket, zmq.Socket]]:
    """A client, and the sockets of the scheduler (what the client sends) and of the
    detokenizer (what it receives) that this test plays."""
    to_scheduler, from_detokenizer = ipc.new_ipc_names(2)
    ctx = zmq.Context()
    scheduler = ipc.bind(ctx, zmq.PULL, to_scheduler)
    client = SchedulerClient(to_scheduler, from_detokenizer, ServerMetrics())
    detokenizer = ipc.connect(ctx, zmq.PUSH, from_detokenizer)
    receiving = client.start()
    try:
        yield client, scheduler, detokenizer
    finally:
        receiving.cancel()
        client.outbox.sock.close()
        client.recv_sock.close()
        scheduler.close()
        detokenizer.close()
        ipc.remove_ipc_files([to_scheduler, from_detokenizer])


async def _sent_messages(scheduler: zmq.Socket, quiet_s: float = 0.3) -> list[object]:
    """What the client sent the scheduler so far, message by message: read until nothing
    more came for ``quiet_s`` while the event loop ran (the client sends from this loop; a
    blocking wait here would hold back what it has yet to send)."""
    out: list[object] = []
    loop = asyncio.get_running_loop()
    quiet_until = loop.time() + quiet_s
    while loop.time() < quiet_until:
        if scheduler.poll(0):
            out.append(ipc.recv(scheduler))
            quiet_until = loop.time() + quiet_s
        else:
            await asyncio.sleep(0.005)
    return out


def _items(messages: list[object]) -> list[object]:
    """The messages, a list message (a chunk of a group) as its items."""
    return [item for m in messages for item in (m if isinstance(m, list) else [m])]


async def _sent(scheduler: zmq.Socket) -> list[object]:
    """What the client sent the scheduler so far, a chunk of a group as its items."""
    return _items(await _sent_messages(scheduler))


def test_a_rid_sent_again_right_after_its_abort_gets_only_its_own_updates():
    async def scenario() -> None:
        async with _backend() as (client, scheduler, detokenizer):
            params = SamplingParams(max_new_tokens=4)
            first = client.submit("mine", [1, 2, 3], params)
            sent = ipc.recv(scheduler)
            assert isinstance(sent, TokenizedGenerateReq) and sent.rid == first.wire_id
            client.abort(first)
            assert ipc.recv(scheduler) == AbortReq(first.wire_id)
            again = client.submit("mine", [1, 2, 3], params)  # the same rid, at once
            assert ipc.recv(scheduler).rid == again.wire_id != first.wire_id
            # the backend's last words on the first request, then the second one's answer
            ipc.send(detokenizer, _update(first.wire_id, [7]))
            ipc.send(detokenizer, _update(first.wire_id, [], {"type": "abort", "message": "aborted by the client"}))
            ipc.send(detokenizer, _update(again.wire_id, [4, 5, 6, 8], {"type": "length", "length": 4}))
            await asyncio.wait_for(client.wait(again), 10)
            assert again.rid == "mine" and again.output_ids == [4, 5, 6, 8]
            assert again.finished_reason == {"type": "length", "length": 4}
            assert first.output_ids == [] and client.num_open_requests == 0

    asyncio.run(scenario())


def test_a_group_finishing_in_any_order_is_waited_for_and_nothing_aborted():
    async def scenario() -> None:
        async with _backend() as (client, scheduler, detokenizer):
            states = [client.submit(f"r{i}", [1, 2], SamplingParams(max_new_tokens=1)) for i in range(1500)]
            for state in reversed(states):
                ipc.send(detokenizer, _update(state.wire_id, [7], {"type": "length", "length": 1}))
            await asyncio.wait_for(client.wait_all(states), 30)
            assert all(s.output_ids == [7] for s in states) and client.num_open_requests == 0
            # more requests than ZMQ's default high-water mark (1,000) all went out, none aborted
            sent = collections.Counter(type(m).__name__ for m in await _sent(scheduler))
            assert sent == {"TokenizedGenerateReq": 1500}, sent

    asyncio.run(scenario())


def test_one_loop_watches_a_group_and_aborts_it_when_the_client_goes():
    """A loop per request, each asking every second whether the client was gone, kept the
    HTTP process busy through a /generate batch of 20k prompts."""
    async def scenario() -> None:
        async with _backend() as (client, scheduler, _):
            states = [client.submit(f"r{i}", [1, 2], SamplingParams(max_new_tokens=1)) for i in range(200)]
            asked = 0

            async def gone() -> bool:
                nonlocal asked
                asked += 1
                return asked == 2

            await asyncio.wait_for(client.wait_all(states, gone), 30)
            assert asked == 2 and client.num_open_requests == 0
            assert sum(isinstance(m, AbortReq) for m in await _sent(scheduler)) == 200

    asyncio.run(scenario())


def test_a_client_gone_is_seen_while_the_group_keeps_finishing_requests():
    """A batch finishing a request every step never gave the wait a quiet second, and the
    client's leaving was looked at only after one: the batch ran to its end for nobody."""
    async def scenario() -> None:
        async with _backend() as (client, scheduler, detokenizer):
            states = [client.submit(f"r{i}", [1, 2], SamplingParams(max_new_tokens=1)) for i in range(400)]
            left_at = asyncio.get_running_loop().time() + 0.5

            async def gone() -> bool:
                return asyncio.get_running_loop().time() >= left_at

            async def finish_one_every_20_ms() -> None:
                for state in states:
                    ipc.send(detokenizer, _update(state.wire_id, [7], {"type": "length", "length": 1}))
                    await asyncio.sleep(0.02)

            finishing = asyncio.create_task(finish_one_every_20_ms())
            await asyncio.wait_for(client.wait_all(states, gone), 30)
            finishing.cancel()
            done = sum(s.is_finished for s in states)
            assert done < 150, f"the group ran on for {done * 0.02:.1f} s after its client left"
            assert sum(isinstance(m, AbortReq) for m in await _sent(scheduler)) == len(states) - done

    asyncio.run(scenario())


def test_tokens_made_for_a_request_aborted_here_count_as_generated():
    async def scenario() -> None:
        async with _backend() as (client, _, detokenizer):
            state = client.submit("r0", [1, 2], SamplingParams(max_new_tokens=4))
            client.abort(state)  # the client left; the scheduler's last word still comes
            ipc.send(detokenizer, _update(state.wire_id, [7, 8, 9], {"type": "abort"}))
            for _ in range(100):
                if client.metrics.generation_tokens:
                    break
                await asyncio.sleep(0.01)
            assert client.metrics.generation_tokens == 3 and client.metrics.requests_aborted == 1

    asyncio.run(scenario())


def test_merged_gives_each_change_once_and_closing_it_aborts_the_unfinished():
    async def scenario() -> None:
        async with _backend() as (client, scheduler, detokenizer):
            states = [client.submit(f"r{i}", [1, 2], SamplingParams(max_new_tokens=4)) for i in range(3)]
            ipc.send(detokenizer, _update(states[2].wire_id, [5]))
            ipc.send(detokenizer, _update(states[2].wire_id, [6]))  # two updates before it is looked at: one index
            ipc.send(detokenizer, _update(states[0].wire_id, [9], {"type": "length", "length": 1}))
            await asyncio.sleep(0.3)  # both received
            changes = client.merged(states)
            assert sorted([await anext(changes), await anext(changes)]) == [0, 2]
            assert states[2].output_ids == [5, 6] and states[0].is_finished
            later = asyncio.ensure_future(anext(changes))
            await asyncio.sleep(0.3)
            assert not later.done()  # nothing new
            ipc.send(detokenizer, _update(states[1].wire_id, [3]))
            assert await asyncio.wait_for(later, 10) == 1
            await changes.aclose()  # the client went away
            aborted = [m.rid for m in await _sent(scheduler) if isinstance(m, AbortReq)]
            assert aborted == [states[1].wire_id, states[2].wire_id] and client.num_open_requests == 0

    asyncio.run(scenario())


def test_an_error_set_by_the_server_is_not_wiped_by_a_late_token_update():
    # At shutdown every open request is answered with an error at once; the scheduler may
    # still send a token for it before its handler looks, which must not reopen it.
    state = ReqState("r", 3, False, 1, "r#0")
    client = SchedulerClient.__new__(SchedulerClient)  # no sockets: only the bookkeeping
    client.states, client.by_wire_id, client.request_log = {"r": state}, {"r#0": state}, RequestLog()
    client.end_open_requests("The server is shutting down.", 503)
    token = TokenUpdate("r#0", 1, None, prompt_tokens=3, cached_tokens=0, completion_tokens=1)
    state.apply(StrUpdate(token, "Hello"), np.asarray([5], dtype=np.int32))
    assert state.is_finished and (state.error, state.error_status) == ("The server is shutting down.", 503)



def test_merged_gives_a_request_finishing_while_the_consumer_holds_it_once():
    """A request's last update that arrived while the consumer was busy with that request
    (a slow client's socket) was given again, counted as a second finish, and the group's
    other requests were aborted."""
    async def scenario() -> None:
        async with _backend() as (client, scheduler, detokenizer):
            states = [client.submit(f"r{i}", [1, 2], SamplingParams(max_new_tokens=4)) for i in range(2)]
            ipc.send(detokenizer, _update(states[0].wire_id, [5]))
            await asyncio.sleep(0.3)
            given = []
            async for i in client.merged(states):
                given.append((i, states[i].is_finished))
                if given == [(0, False)]:  # the consumer is slow: meanwhile request 0 ends
                    ipc.send(detokenizer, _update(states[0].wire_id, [6], {"type": "length", "length": 2}))
                    await asyncio.sleep(0.3)
                    ipc.send(detokenizer, _update(states[1].wire_id, [7], {"type": "length", "length": 1}))
                    await asyncio.sleep(0.3)
            assert sorted(given) == [(0, False), (0, True), (1, True)]
            assert not any(isinstance(m, AbortReq) for m in await _sent(scheduler))

    asyncio.run(scenario())


def test_a_large_group_goes_out_in_chunks_while_the_event_loop_runs_and_in_order():
    """100k prompts in one /generate were sent one by one inside the handler: every other
    client (``/health`` too) waited ~5 s. A group goes out in list messages of ``chunk``
    requests, with the event loop running between them; an abort put meanwhile comes after
    its request."""
    async def scenario() -> None:
        async with _backend() as (client, scheduler, _):
            chunk = client.outbox._chunk
            params = SamplingParams(max_new_tokens=1)
            states = client.submit_many([(f"r{k}", [1, 2], params, RequestOptions()) for k in range(3 * chunk + 5)])
            assert client.num_open_requests == len(states) and client.outbox.pending == len(states)
            await asyncio.sleep(0)  # the loop runs: one chunk out
            assert 0 < client.outbox.pending < len(states)
            client.abort(states[-1])  # not yet sent: its abort must not overtake it
            client.cancel(states[-2], "stop")
            await asyncio.sleep(0.1)
            messages = await _sent_messages(scheduler)
            assert [len(m) for m in messages] == [chunk, chunk, chunk, 5 + 2]  # the aborts queued behind
            items = _items(messages)
            assert [m.rid for m in items[:len(states)]] == [s.wire_id for s in states]
            assert items[len(states):] == [AbortReq(states[-1].wire_id), AbortReq(states[-2].wire_id, "stop")]
            assert client.outbox.pending == 0

    asyncio.run(scenario())


def test_a_group_with_a_taken_or_repeated_id_opens_none():
    async def scenario() -> None:
        async with _backend() as (client, scheduler, _):
            params, options = SamplingParams(max_new_tokens=1), RequestOptions()
            client.submit("a", [1], params)
            for rids in (["b", "a"], ["c", "d", "c"]):
                with pytest.raises(ValueError, match="already in use"):
                    client.submit_many([(rid, [1], params, options) for rid in rids])
            assert list(client.states) == ["a"]
            assert [m.rid for m in await _sent(scheduler)] == [client.states["a"].wire_id]

    asyncio.run(scenario())


def test_requests_whose_chunk_could_not_be_sent_end_with_a_500_and_the_rest_go_out():
    """A send that fails (the socket closed at shutdown) took a chunk's requests with it,
    silently: their clients waited forever. They end with an error; the queue drains on."""
    async def scenario() -> None:
        async with _backend() as (client, scheduler, _):
            chunk = client.outbox._chunk
            real_send, sends = client.outbox.sock.send_multipart, []

            def second_send_fails(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                sends.append(1)
                if len(sends) == 2:
                    raise zmq.ZMQError(zmq.ENOTSOCK)
                return real_send(*args, **kwargs)

            client.outbox.sock.send_multipart = second_send_fails
            params = SamplingParams(max_new_tokens=1)
            states = client.submit_many([(f"r{k}", [1], params, RequestOptions()) for k in range(3 * chunk)])
            await asyncio.sleep(0.1)
            lost = states[chunk:2 * chunk]
            assert all(s.error is not None and "could not be sent" in s.error and s.error_status == 500 for s in lost)
            assert all(s.is_finished for s in lost) and client.num_open_requests == 2 * chunk
            assert [m.rid for m in await _sent(scheduler)] == [s.wire_id for s in states[:chunk] + states[2 * chunk:]]
            await asyncio.wait_for(client.wait_all(lost), 5)  # answered, not hanging

    asyncio.run(scenario())


def test_what_is_queued_when_the_loop_closes_is_reported_unsent():
    async def scenario() -> list[ReqState]:
        async with _backend() as (client, _, _):
            params = SamplingParams(max_new_tokens=1)
            states = client.submit_many([(f"r{k}", [1], params, RequestOptions()) for k in range(3 * client.outbox._chunk)])
            client.outbox._drain.cancel()  # before its first step, as at the loop's close
            await asyncio.sleep(0.01)
            assert client.outbox.pending == 0 and client.outbox._drain is None
            return states

    states = asyncio.run(scenario())
    assert all(s.error_status == 500 and "shutting down" in s.error for s in states)


def test_a_group_is_aborted_in_one_message_per_chunk():
    """A 100k-prompt batch's client going away sent 100k abort messages, one by one."""
    async def scenario() -> None:
        async with _backend() as (client, scheduler, _):
            chunk = client.outbox._chunk
            params = SamplingParams(max_new_tokens=1)
            states = client.submit_many([(f"r{k}", [1], params, RequestOptions()) for k in range(chunk + 1)])
            await asyncio.sleep(0.05)
            await _sent(scheduler)
            client.abort_many(states)
            client.cancel_many(states, "too late")  # the aborted are no longer open: nothing
            await asyncio.sleep(0.05)
            messages = await _sent_messages(scheduler)
            assert [len(m) if isinstance(m, list) else 1 for m in messages] == [chunk, 1]
            assert _items(messages) == [AbortReq(s.wire_id) for s in states] and client.num_open_requests == 0

    asyncio.run(scenario())
