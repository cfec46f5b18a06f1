"""Chat messages with their tool call ids renamed by order of appearance, so that two runs
compare equal whatever ids each drew (the OpenAI route draws random ones)."""

from __future__ import annotations

from typing import Any


def same_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids: dict[str, str] = {}
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": ids.setdefault(c["id"], f"id{len(ids)}")} for c in m["tool_calls"]]
        if "tool_call_id" in m:
            m["tool_call_id"] = ids.setdefault(m["tool_call_id"], f"id{len(ids)}")
        out.append(m)
    return out
