"""What SGLang's model gateway asks a worker for, on a plain forkserve server: the newer
info routes (``/model_info``, ``/server_info``) and the load report (``/get_load``) in
SGLang's shapes. The gateway itself is in ``test_data_parallel.py``."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def test_new_info_routes_answer_as_the_old_ones(server):
    for old, new in (("/get_model_info", "/model_info"), ("/get_server_info", "/server_info")):
        a, b = (httpx.get(server.url + path, timeout=30).json() for path in (old, new))
        a.pop("scheduler", None), b.pop("scheduler", None)  # live counters
        assert a == b, new
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    # the gateway loads the tokenizer from here and reads these as integers
    assert info["model_path"] and isinstance(info["max_total_tokens"], int)
    assert isinstance(info["max_running_requests"], int) and isinstance(info["version"], str)


def _load(server) -> dict:
    loads = httpx.get(server.url + "/get_load", timeout=30).json()
    assert isinstance(loads, list) and len(loads) == 1  # one entry per data-parallel rank
    assert set(loads[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    return loads[0]


def test_get_load_counts_a_running_request(server):
    deadline = time.monotonic() + 60
    while _load(server)["num_reqs"] and time.monotonic() < deadline:  # other tests' requests
        time.sleep(0.2)
    idle = _load(server)
    assert idle == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": idle["num_tokens"]}
    prompt = "Count from one to one hundred in words: one, two, three,"
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0}}
    done = threading.Event()

    def run() -> None:
        httpx.post(server.url + "/generate", json=body, timeout=120)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    busy = None
    while not done.is_set():
        load = _load(server)
        if load["num_reqs"] >= 1 and load["num_tokens"] > idle["num_tokens"]:
            busy = load
            break
        time.sleep(0.02)
    assert busy is not None, "the load report never showed the running request"
    done.wait(120)
