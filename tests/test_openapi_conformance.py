"""``/openapi.json`` against the real server, by schemathesis: requests generated from the
documented bodies (its examples, boundary values and random ones) get no server error,
and every answer's status code, content type and body are ones the document declares.

The server (``small_server`` in conftest.py) runs with a short context (64 tokens), so that
generated requests which ask for long outputs are refused quickly (a documented 400), and a
generated request that sets no output limit gets one of a few tokens (tests/schemathesis_hooks.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_the_document_names_every_route_and_its_answers(small_server):
    doc = httpx.get(small_server.url + "/openapi.json", timeout=30).json()
    for path in ("/generate", "/v1/chat/completions", "/v1/chat/completions/render", "/v1/completions", "/health",
                 "/metrics", "/get_server_info"):
        for operation in doc["paths"][path].values():
            assert "200" in operation["responses"], path
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/ChatCompletionRequest")
    # a field accepted only unset shows only that (NeutralOnly), on every route's body
    for model, field in (("ChatCompletionRequest", "lora_path"), ("CompletionRequest", "suffix"),
                         ("GenerateReqInput", "lora_path"), ("ResponsesRequest", "prompt"),
                         ("StructuredOutputs", "whitespace_pattern")):
        assert "not supported" in doc["components"]["schemas"][model]["properties"][field]["description"], model
    assert "text/event-stream" in doc["paths"]["/generate"]["post"]["responses"]["200"]["content"]


def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(small_server, tmp_path):
    st = shutil.which("schemathesis") or shutil.which("st")
    assert st is not None, "schemathesis is in the test extra: pip install -e '.[test]'"
    done = subprocess.run(
        [st, "run", small_server.url + "/openapi.json", "--checks", CHECKS, "--max-examples", "4", "--seed", "1",
         "--phases", "examples,coverage,fuzzing", "--request-timeout", "60", "--workers", "1", "--no-color"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
