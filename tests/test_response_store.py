"""The stores of /v1/responses (``runtime/server/response_store.py``) against a brute-force
model: any sequence of stores, reads and deletes gives the same answers and evicts the same
responses (least recently used beyond capacity) in memory and in SQLite; and two SQLite
stores on one file, as two replicas hold them, see each other's responses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.server.protocol import ApiError
from runtime.server.response_store import MemoryTable, ResponseStore, SqliteTable

IDS = [f"resp_{i}" for i in range(4)]
# puts twice as likely as each other operation, so that capacity (2) is exceeded often
OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "response", "conversation", "items", "delete"]),
                         st.sampled_from(IDS)), min_size=4, max_size=40)


def sqlite_store(path: str, capacity: int) -> ResponseStore:
    return ResponseStore(table=SqliteTable(path, "responses", capacity))


class Model:
    """A list, most recently used last: what the stores must do."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.order, self.data = capacity, [], {}

    def touch(self, rid):
        self.order.remove(rid)
        self.order.append(rid)

    def put(self, rid, value):
        if rid in self.data:
            self.order.remove(rid)
        self.data[rid] = value
        self.order.append(rid)
        while len(self.order) > self.capacity:
            del self.data[self.order.pop(0)]


def run(store, model, ops):
    for k, (op, rid) in enumerate(ops):
        if op == "put":
            value = ({"id": rid, "k": k}, [{"role": "user", "content": f"m{k}"}], [{"type": "message", "n": k}])
            store.put(*value)
            model.put(rid, value)
            continue
        get = {"response": store.response, "conversation": store.conversation, "items": store.input_items,
               "delete": store.delete}[op]
        if rid not in model.data:
            with pytest.raises(ApiError) as err:
                get(rid)
            assert err.value.status == (400 if op == "conversation" else 404)
            continue
        got = get(rid)
        if op == "delete":
            model.order.remove(rid)
            del model.data[rid]
            continue
        model.touch(rid)
        assert got == model.data[rid][{"response": 0, "conversation": 1, "items": 2}[op]]


@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_both_stores_do_what_the_model_does(tmp_path_factory, ops):
    run(ResponseStore(capacity=2), Model(2), ops)
    path = tmp_path_factory.mktemp("store") / "responses.sqlite"
    run(sqlite_store(str(path), capacity=2), Model(2), ops)


def test_two_sqlite_stores_on_one_file_share_their_responses(tmp_path):
    path = str(tmp_path / "responses.sqlite")
    a, b = sqlite_store(path, capacity=2), sqlite_store(path, capacity=2)
    a.put({"id": "resp_1"}, [{"role": "user", "content": "hi"}], [])
    assert b.conversation("resp_1") == [{"role": "user", "content": "hi"}]
    b.put({"id": "resp_2"}, [], [])
    a.response("resp_1")  # resp_1 is now the most recently used, on both
    b.put({"id": "resp_3"}, [], [])
    with pytest.raises(ApiError):
        a.response("resp_2")
    b.delete("resp_1")
    with pytest.raises(ApiError, match="responses.sqlite"):
        a.response("resp_1")


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_conversations_keep_their_items_in_order_on_either_table(tmp_path, backend):
    """Two stores on one file stand for two replicas: what one appends the other sees."""
    from runtime.server.response_store import ConversationStore

    def table():
        return MemoryTable() if backend == "memory" else SqliteTable(str(tmp_path / "r.sqlite"), "conversations")

    first = table()
    a, b = ConversationStore(table=first), ConversationStore(table=first if backend == "memory" else table())
    conv = a.create([{"id": "m0"}], {"k": "v"})
    b.append(conv["id"], [{"id": "m1"}, {"id": "m2"}])
    a.append(conv["id"], [{"id": "m3"}])
    assert [i["id"] for i in b.items(conv["id"])] == ["m0", "m1", "m2", "m3"]
    assert b.update(conv["id"], {"k": "w"})["metadata"] == {"k": "w"} == a.get(conv["id"])["metadata"]
    a.remove_item(conv["id"], "m1")
    assert [i["id"] for i in b.items(conv["id"])] == ["m0", "m2", "m3"]
    with pytest.raises(ApiError) as err:
        b.item(conv["id"], "m1")
    assert err.value.status == 404 and err.value.param == "item_id"
    with pytest.raises(ApiError) as err:
        a.items("conv_x", "conversation")
    assert err.value.status == 400
    b.delete(conv["id"])
    with pytest.raises(ApiError):
        a.get(conv["id"])


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_running_response_not_written_again_reads_as_failed(tmp_path, backend):
    """A background response's server writes it again every few seconds; one that stopped
    doing so (killed outright) is read as failed, not in progress for ever."""
    import time

    table = MemoryTable() if backend == "memory" else SqliteTable(str(tmp_path / "r.sqlite"), "responses")
    store = ResponseStore(table=table, stale_after=0.3)
    running = {"id": "resp_1", "status": "in_progress", "output": []}
    store.put(running, None, [])
    store.put({"id": "resp_2", "status": "completed", "output": []}, [{"role": "user", "content": "x"}], [])
    assert store.response("resp_1")["status"] == "in_progress"
    time.sleep(0.2)
    store.put(running, None, [])  # the heartbeat
    time.sleep(0.2)
    assert store.peek("resp_1")["status"] == "in_progress"
    time.sleep(0.2)
    stale = store.response("resp_1")
    assert stale["status"] == "failed" and "stopped" in stale["error"]["message"]
    assert store.peek("resp_1")["status"] == "failed"
    with pytest.raises(ApiError, match="ended failed"):
        store.conversation("resp_1")
    assert store.response("resp_2")["status"] == "completed"  # an ended response never goes stale


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_one_response_at_a_time_holds_a_conversation(tmp_path, backend):
    """Two stores on one file stand for two replicas: a hold taken on one is seen on the
    other; only its owner renews or releases it; changes to the items keep it; one not
    renewed lapses."""
    import time

    from runtime.server.response_store import ConversationStore

    def table():
        return MemoryTable() if backend == "memory" else SqliteTable(str(tmp_path / "r.sqlite"), "conversations")

    first = table()
    a = ConversationStore(table=first, lease=0.4)
    b = ConversationStore(table=first if backend == "memory" else table(), lease=0.4)
    conv = a.create([{"id": "m0"}], None)["id"]
    assert [i["id"] for i in a.hold(conv, "resp_a")] == ["m0"]
    with pytest.raises(ApiError) as err:
        b.hold(conv, "resp_b")
    assert (err.value.status, err.value.param, err.value.body()["error"]["code"]) == (
        400, "conversation", "conversation_locked")
    b.release(conv, "resp_b")  # not its hold: nothing changes
    b.append(conv, [{"id": "m1"}])  # items may still be added, and keep the hold
    b.update(conv, {"k": "v"})
    with pytest.raises(ApiError, match="resp_a"):
        b.hold(conv, "resp_b")
    assert [i["id"] for i in a.hold(conv, "resp_a")] == ["m0", "m1"]  # renewed by its owner
    a.release(conv, "resp_a")
    assert [i["id"] for i in b.hold(conv, "resp_b")] == ["m0", "m1"]
    time.sleep(0.5)  # resp_b's server stopped renewing it
    a.hold(conv, "resp_c")
    with pytest.raises(ApiError) as err:
        a.hold("conv_x", "resp_d")
    assert err.value.status == 400 and err.value.param == "conversation"
    a.release("conv_x", "resp_d")  # a missing conversation: nothing


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_cancel_asked_elsewhere_survives_the_heartbeat_until_the_run_ends(tmp_path, backend):
    """Two stores on one file stand for two replicas: one marks a response running on the
    other for cancelling; the runner's heartbeat keeps the mark and reports it; an ended
    response takes no mark."""
    def table():
        return MemoryTable() if backend == "memory" else SqliteTable(str(tmp_path / "r.sqlite"), "responses")

    first = table()
    runner, other = ResponseStore(table=first), ResponseStore(table=first if backend == "memory" else table())
    running = {"id": "resp_1", "status": "in_progress", "output": []}
    runner.put(running, None, [{"id": "msg_1"}])
    assert not runner.beat(running, [{"id": "msg_1"}]) and not runner.cancel_asked("resp_1")
    other.ask_cancel("resp_1")
    assert runner.cancel_asked("resp_1")
    assert runner.beat({**running, "output": [{"id": "m"}]}, [{"id": "msg_1"}])  # written, and the mark kept
    assert runner.cancel_asked("resp_1") and other.response("resp_1")["output"] == [{"id": "m"}]
    runner.put({**running, "status": "cancelled"}, None, [{"id": "msg_1"}])  # the run ends: no mark
    assert not other.cancel_asked("resp_1") and other.response("resp_1")["status"] == "cancelled"
    runner.put({"id": "resp_2", "status": "completed", "output": []}, [], [])
    other.ask_cancel("resp_2")
    assert not runner.cancel_asked("resp_2")
    other.ask_cancel("resp_missing")  # nothing


def test_files_written_before_the_records_had_names_read_the_same(tmp_path):
    """The JSON layout of a ``--response-store`` file: a response is
    ``[response, conversation, input_items, written_at]`` plus ``true`` once a cancel is
    asked; a conversation ``[object, items]`` plus ``[holder, until]`` while held. Written
    here by hand, as an older server wrote them, and read and changed through the stores."""
    import json
    import sqlite3
    import time

    from runtime.server.response_store import ConversationStore

    path = str(tmp_path / "store.db")
    responses = ResponseStore(table=SqliteTable(path, "responses"))
    conversations = ConversationStore(table=SqliteTable(path, "conversations"))
    now = time.time()
    running = {"id": "resp_a", "status": "in_progress"}
    conv = {"id": "conv_a", "object": "conversation", "created_at": 1, "metadata": {}}
    items = [{"id": "msg_1", "type": "message"}]
    with sqlite3.connect(path) as db:
        for table, key, value in (("responses", "resp_a", [running, None, [{"x": 1}], now, True]),
                                  ("conversations", "conv_a", [conv, items, ["resp_a", now + 60]])):
            db.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, 0, ?)", (key, json.dumps(value)))
    assert responses.cancel_asked("resp_a") and responses.input_items("resp_a") == [{"x": 1}]
    assert conversations.items("conv_a") == items and conversations.get("conv_a") == conv
    with pytest.raises(ApiError, match="resp_a"):
        conversations.hold("conv_a", "resp_b")
    conversations.release("conv_a", "resp_a")
    responses.beat({**running, "output": []}, [{"x": 2}])
    with sqlite3.connect(path) as db:
        stored = {key: json.loads(value) for key, value in db.execute(
            "SELECT id, value FROM responses UNION ALL SELECT id, value FROM conversations")}
    assert stored["conv_a"] == [conv, items]  # the hold gone, nothing else changed
    response, conversation, input_items, written_at, asked = stored["resp_a"]
    assert (response["output"], conversation, input_items, asked) == ([], None, [{"x": 2}], True)
    assert written_at >= now
