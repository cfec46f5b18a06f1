"""A JSON-extraction agent: read a document once, then fill the typed arguments of several
tools from it in parallel branches, each constrained to its tool's JSON schema (pydantic
models here), pick the tool to call with ``select``, and call it with the parsed
arguments. Every branch shares the document's KV cache; every output parses.

    python -m examples.json_extraction [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

import frontend_lang as sgl

DOCUMENT = """Order 4471 was placed on 12 March 2024 by Dana Whitfield of Lyon for 3 espresso
machines at 249 euros each. She asked for express delivery because her cafe reopens on
Friday. The payment was approved by the bank the same day. Support ticket 88 notes that
one machine arrived with a cracked water tank and should be replaced."""


class CreateShipment(BaseModel):
    customer: str = Field(max_length=24)
    city: str = Field(max_length=16)
    quantity: int = Field(ge=1, le=100)
    express: bool


class RefundOrReplace(BaseModel):
    order_id: int = Field(ge=0, le=99999)
    action: Literal["refund", "replace"]
    reason: str = Field(max_length=40)


class Invoice(BaseModel):
    customer: str = Field(max_length=24)
    unit_price_euros: int = Field(ge=0, le=10000)
    quantity: int = Field(ge=1, le=100)


TOOLS = {"create_shipment": CreateShipment, "refund_or_replace": RefundOrReplace, "invoice": Invoice}


@sgl.function
def extract_and_act(s, document: str):
    s += sgl.system("You read business documents and fill in tool arguments as JSON.")
    s += sgl.user(f"Document:\n{document}")
    calls = s.fork(len(TOOLS))
    names = list(TOOLS)
    calls += lambda i: sgl.user(f"Fill in the arguments of the tool {names[i]} from the document.") + sgl.assistant(
        sgl.gen("args", json_schema=TOOLS[names[i]], max_tokens=80, temperature=0)
    )
    calls.join()
    for name, call in zip(names, calls, strict=True):
        s[name] = TOOLS[name].model_validate_json(call["args"])  # computed values for the caller
    s += sgl.user("Which tool should be called first?")
    s += sgl.assistant(sgl.select("first", names))


def main() -> None:
    from examples._cli import NEEDS_LOGPROBS, backend_from_args

    backend, _ = backend_from_args(__doc__ or "", NEEDS_LOGPROBS)
    state = extract_and_act.run(document=DOCUMENT, backend=backend)
    for name in TOOLS:
        print(f"{name}: {state[name]!r}")
    print(f"call first: {state['first']}")
    backend.shutdown()


if __name__ == "__main__":
    main()
