"""The HTTP process's scheduler client over real ZMQ sockets, with this test standing in for
the scheduler and the detokenizer: updates reach the request they were made for, even when a
client aborts a request and sends its ``rid`` again before the backend's last word on the
first one arrives."""

from __future__ import annotations

import asyncio

import numpy as np
import zmq

from runtime import ipc
from runtime.ipc.messages import AbortReq, BatchStrOut, StrUpdate, TokenizedGenerateReq, TokenUpdate
from runtime.sampling.params import SamplingParams
from runtime.server.metrics import ServerMetrics
from runtime.server.request_log import RequestLog
from runtime.server.scheduler_client import ReqState, SchedulerClient


def _update(wire_id: str, ids: list[int], finished: dict | None = None) -> BatchStrOut:
    token = TokenUpdate(wire_id, len(ids), finished, prompt_tokens=3, cached_tokens=0, completion_tokens=len(ids))
    return BatchStrOut([StrUpdate(token, "x" * len(ids))], np.asarray(ids, dtype=np.int32))


def test_a_rid_sent_again_right_after_its_abort_gets_only_its_own_updates():
    async def scenario() -> None:
        to_scheduler, from_detokenizer = ipc.new_ipc_names(2)
        ctx = zmq.Context()
        scheduler = ipc.bind(ctx, zmq.PULL, to_scheduler)
        client = SchedulerClient(to_scheduler, from_detokenizer, ServerMetrics())
        detokenizer = ipc.connect(ctx, zmq.PUSH, from_detokenizer)
        receiving = client.start()
        try:
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
        finally:
            receiving.cancel()
            client.send_sock.close()
            client.recv_sock.close()
            scheduler.close()
            detokenizer.close()
            ipc.remove_ipc_files([to_scheduler, from_detokenizer])

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

