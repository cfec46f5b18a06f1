"""Shared fixtures. The real default model is loaded once per session and shared."""

from __future__ import annotations

import pytest
import torch

from radix_cache import RadixCache, SlotAllocator


@pytest.fixture(scope="session")
def model_dir():
    from runtime.model_loader import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def engine(model_dir):
    """The default model in fp32, radix cache on, small chunks so chunking is exercised."""
    from runtime.engine import Engine

    eng = Engine(str(model_dir), dtype="float32", max_total_tokens=40_000, chunked_prefill_size=256)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def chat_prompt(engine) -> str:
    """A question the model answers in a few tokens, then EOS, as a chat prompt."""
    question = "What is 2+2? Answer with a single number."
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": question}])


@pytest.fixture(scope="module")
def ref(engine, chat_prompt) -> dict:
    """The shared engine's greedy answer to ``chat_prompt``: a few tokens, ending in EOS."""
    out = engine.generate(chat_prompt, {"temperature": 0.0, "max_new_tokens": 16})
    ids = out["output_ids"]
    assert 4 <= len(ids) < 16, out
    return out


@pytest.fixture(scope="session")
def other_kernel_builds(tmp_path_factory):
    """A kernel cache for builds with other flags than this CPU's own (each flag set hashes
    to a library of its own), shared so that a build several test files use compiles once."""
    return tmp_path_factory.mktemp("other_kernel_builds")


@pytest.fixture(scope="session")
def tiny_gqa_llama(tmp_path_factory, model_dir):
    """A 2-layer random-weight Llama with head size 64 and 3 query heads per KV head
    (SmolLM2's ratio), saved as an HF folder with the default model's tokenizer."""
    from tests.tiny_models import build_hf_model, save_hf_folder

    sizes = dict(hidden_size=192, num_attention_heads=3, num_key_value_heads=1, intermediate_size=256)
    model = build_hf_model("Llama", dict(tie_word_embeddings=True), sizes)
    return save_hf_folder(model, tmp_path_factory.mktemp("tiny_gqa_llama"), model_dir)


@pytest.fixture(autouse=True)
def _kv_pool_invariant(request):
    """After every test that used the shared engine, the KV pool must be whole again."""
    yield
    if "engine" in request.fixturenames:
        eng = request.getfixturevalue("engine")
        assert not eng.has_work, "a test left requests queued or running"
        eng.scheduler.check_invariants()


class Harness:
    """A cache, its allocator, and the count of slots the test holds outside the tree."""

    def __init__(self, num_slots: int = 64, page_size: int = 1, disable: bool = False) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.cache = RadixCache(self.allocator, page_size=page_size, disable=disable)
        self.held = 0

    def take(self, n: int) -> torch.Tensor:
        slots = self.allocator.alloc(n)
        assert slots is not None, f"test pool too small for {n} slots"
        self.held += n
        return slots

    def give_back(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)
        self.held -= slots.numel()

    def insert(self, tokens, namespace=None) -> tuple[int, torch.Tensor]:
        """Insert ``tokens`` with fresh slots, as a request finishing would; return
        (already cached length, the slots handed in)."""
        slots = self.take(len(tokens))
        p = self.cache.insert(tokens, slots, namespace=namespace)
        a = self.cache.aligned_len(len(tokens))
        if self.cache.disable:
            assert p == 0
            self.held -= a  # the cache freed slots[:a] itself
            self.give_back(slots[a:])
        else:
            self.held -= a - p  # the tree owns slots[p:a]
            self.give_back(torch.cat([slots[:p], slots[a:]]))
        return p, slots

    def check(self) -> None:
        self.cache.check_invariants(num_held_outside=self.held)


@pytest.fixture
def make():
    made: list[Harness] = []

    def factory(**kwargs) -> Harness:
        h = Harness(**kwargs)
        made.append(h)
        return h

    yield factory
    for h in made:
        h.check()


# Same engine settings as the ``engine`` fixture, so greedy outputs can be compared.
SERVER_ENGINE_ARGS = ("--dtype", "float32", "--max-total-tokens", "40000", "--chunked-prefill-size", "256")


@pytest.fixture(scope="session")
def small_server():
    """A real ``forkserve serve`` on the default model with a 64-token context: limits near
    the context in a few steps, and the OpenAPI fuzzer's requests stay short. The fuzzer
    calls every route (``/flush_cache``, ``/configure_logging``, ...): tests using this
    server after it must not depend on its cache or log settings."""
    from runtime.server.server_process import ServerProcess

    proc = ServerProcess("--max-context-len", "64", "--max-total-tokens", "4096", "--max-running-requests", "8").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.read_output()


@pytest.fixture(scope="session")
def server():
    """A real ``forkserve serve`` on the default model, shared by the HTTP tests."""
    from runtime.server.server_process import ServerProcess
    from tests.proc_utils import pid_alive

    proc = ServerProcess(*SERVER_ENGINE_ARGS).wait_ready()
    pids = proc.info()["process_ids"]
    yield proc
    code = proc.stop()  # SIGTERM
    assert code == 0, f"server exited with {code}:\n{proc.read_output()}"
    left = [name for name, pid in pids.items() if pid_alive(pid)]
    assert not left, f"processes left behind after SIGTERM: {left}"


@pytest.fixture(scope="session")
def sglang_python():
    """The python of a venv with SGLang's own package (``tests/sglang_venv.py``)."""
    from tests.sglang_venv import sglang_venv

    return sglang_venv() / "bin" / "python"


@pytest.fixture(scope="module")
def local(engine):
    """The DSL's in-process backend on the shared engine."""
    import frontend_lang as sgl

    backend = sgl.EngineBackend(engine)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def remote(server):
    """The DSL's HTTP backend on the shared server."""
    import frontend_lang as sgl

    backend = sgl.RuntimeEndpoint(server.url)
    yield backend
    backend.shutdown()


@pytest.fixture
def ctrl_c():
    """Ctrl-C as a terminal delivers it, whatever this test process inherited (a job started
    in the background from a shell has SIGINT ignored or blocked): Python's own handler, the
    signal unblocked on the main thread; both put back afterwards. Yields the main thread's
    id, for ``signal.pthread_kill(main, signal.SIGINT)``."""
    import signal
    import threading

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield threading.main_thread().ident
    finally:
        if signal.SIGINT in blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, handler)
