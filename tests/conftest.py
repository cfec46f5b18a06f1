"""Shared fixtures. The real default model is loaded once per session and shared."""

from __future__ import annotations

import pytest


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


@pytest.fixture(autouse=True)
def _kv_pool_invariant(request):
    """After every test that used the shared engine, the KV pool must be whole again."""
    yield
    if "engine" in request.fixturenames:
        eng = request.getfixturevalue("engine")
        assert not eng.scheduler.has_work, "a test left requests queued or running"
        eng.scheduler.check_invariants()
