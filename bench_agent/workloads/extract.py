"""Extraction: one long shared document, then many schema-constrained extractions forked
from it (each fills the typed arguments of a different tool from the document, as an agent
does before calling tools). Outputs end where their JSON object ends (``ignore_eos`` off),
so output lengths depend on the server's tokens; the schemas bound every value, so a call
never runs into ``max_tokens``."""

from __future__ import annotations

import json
from typing import Any

import frontend_lang as sgl
from bench_agent.synth import rng_for, text
from bench_agent.workloads.base import Workload

PRESETS = {
    "tiny": {"document_tokens": 60, "extractions": 2, "fields": 3},
    "quick": {"document_tokens": 1200, "extractions": 4, "fields": 6},
    "full": {"document_tokens": 2000, "extractions": 8, "fields": 10},
}
_FIELD_TYPES = (
    {"type": "string", "maxLength": 16},
    {"type": "integer", "minimum": 0, "maximum": 9999},
    {"type": "string", "enum": ["low", "medium", "high"]},
    {"type": "boolean"},
)
_NAMES = ("customer", "amount", "priority", "urgent", "city", "quantity", "status", "approved", "product", "year",
          "region", "count")


def tool_schema(tool: int, fields: int) -> dict[str, Any]:
    """The arguments of tool ``tool``: ``fields`` typed, bounded, required properties."""
    props = {f"{_NAMES[(tool + k) % len(_NAMES)]}_{k}": _FIELD_TYPES[(tool + k) % len(_FIELD_TYPES)] for k in range(fields)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def max_tokens_for(fields: int) -> int:
    # key (~4 tokens) + value (at most ~8) + separators per field, and the braces
    return 16 * fields + 8


@sgl.function
def extract_program(s, document: str, extractions: int, fields: int):
    s += sgl.system("You read documents and fill in tool arguments as JSON.")
    s += sgl.user(f"Document:\n{document}")
    calls = s.fork(extractions)
    calls += lambda i: sgl.user(f"Fill in the arguments of tool {i} from the document.") + sgl.assistant(
        sgl.gen("arguments", json_schema=json.dumps(tool_schema(i, fields)), max_tokens=max_tokens_for(fields),
                ignore_eos=False)
    )
    calls.join()


def make_args(index: int, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    return {
        "document": f"Document {index}: " + text(rng_for("extract/document", seed, index), sizes["document_tokens"]),
        "extractions": sizes["extractions"],
        "fields": sizes["fields"],
    }


WORKLOAD = Workload(
    name="extract",
    summary="long shared document, then schema-constrained JSON extractions forked from it",
    program=extract_program,
    presets=PRESETS,
    default_programs={"tiny": 2, "quick": 8, "full": 16},
    make_args=make_args,
    gen_calls=lambda z: z["extractions"],
    fixed_lengths=False,
)
