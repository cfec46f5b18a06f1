"""Chat prompts with tools: the model's own template when it can show tools and tool calls,
else the template shipped here for ChatML models (``chatml_hermes_tools.jinja``, hermes
format), or the file given with ``--chat-template``."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("chatml_hermes_tools.jinja")
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}


@lru_cache(maxsize=8)
def _renders_tools(template: str | None, hf_tokenizer: Any) -> bool:
    """Whether ``template`` shows a tool list (renders a probe tool's name)."""
    if not template:
        return False
    try:
        text = hf_tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[_PROBE_TOOL],
                                                chat_template=template, tokenize=False, add_generation_prompt=True)
    except Exception:
        return False
    return "probe_tool_7f3a" in text


def tool_template(hf_tokenizer: Any, override: str | None = None) -> str:
    """The template to render chats with tools: ``override`` (a file's text) if given, the
    model's own if it shows tools, else the shipped ChatML one."""
    if override:
        return override
    own = hf_tokenizer.chat_template
    if _renders_tools(own, hf_tokenizer):
        return own
    if own and "<|im_start|>" in own:
        return SHIPPED.read_text()
    raise ValueError("this model's chat template cannot show tools and is not ChatML; give one that can with "
                     "--chat-template FILE")


def render(hf_tokenizer: Any, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool = True, **kwargs: Any) -> str:
    for m in messages:  # templates write arguments as text; OpenAI sends them as a JSON string
        for call in m.get("tool_calls") or []:
            json.loads(call["function"]["arguments"])  # a 400 upstream if not JSON
    return hf_tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=template, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
