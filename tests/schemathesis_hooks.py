"""schemathesis hooks for tests/test_openapi_conformance.py (loaded through the
``SCHEMATHESIS_HOOKS`` environment variable).

A generated request to a route that generates text, setting no output limit, gets one of a
few tokens: without it each such request ran to the test server's 64-token context (of
~10,000 cases, a second each on a slow CPU: two thirds of the run went to /v1/responses
alone). The check is about the answers' status and shape, not their length; a limit the
case does set, valid or not, is left as generated.
"""

from __future__ import annotations

from typing import Any

import schemathesis

LIMIT = 3  # output tokens of a generated request that sets no limit of its own
# the field that limits the output, by route
TOP_LEVEL_LIMIT = {"/v1/responses": "max_output_tokens", "/v1/completions": "max_tokens",
                   "/v1/chat/completions": "max_tokens", "/invocations": "max_tokens"}
OTHER_NAMES = ("max_completion_tokens",)  # chat's newer name for max_tokens


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    body, path = case.body, case.operation.path
    if not isinstance(body, dict):
        return
    if path == "/generate":
        params = body.get("sampling_params")
        if params is None:
            body["sampling_params"] = {"max_new_tokens": LIMIT}
        elif isinstance(params, dict) and params.get("max_new_tokens") is None:
            params["max_new_tokens"] = LIMIT
    elif (name := TOP_LEVEL_LIMIT.get(path)) and all(body.get(n) is None for n in (name, *OTHER_NAMES)):
        body[name] = LIMIT
