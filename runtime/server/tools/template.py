"""Chat prompts with tools: the model's own template when it can show tools and tool calls,
else the template shipped here for the model's chat format, or the one given with
``--chat-template`` (a file, or the name of a shipped template).

Shipped templates, one per call format (``--tool-call-parser auto`` reads the format back
from the template, ``parsers.parser_for_template``):
- ``chatml_hermes_tools``: ChatML (``<|im_start|>``, the default model's format), hermes calls;
- ``llama3_json_tools``: Llama 3 (``<|start_header_id|>``), llama3_json calls;
- ``mistral_tools``: Mistral (``[INST]``), mistral calls.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
SHIPPED = {path.stem: path for path in sorted(_HERE.glob("*_tools.jinja"))}
# a model's own template -> the shipped template of its chat format (first marker found)
_FORMAT_MARKERS = (("<|im_start|>", "chatml_hermes_tools"), ("<|start_header_id|>", "llama3_json_tools"),
                   ("[INST]", "mistral_tools"))
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``'s text: a shipped template's name or a file's path."""
    if value is None:
        return None
    if value in SHIPPED:
        return SHIPPED[value].read_text()
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"{value!r} is neither a file nor a shipped template ({', '.join(SHIPPED)})")
    text = path.read_text()
    check_template_syntax(text, value)
    return text


def check_template_syntax(template: str, source: str) -> None:
    """``ValueError`` (with the line) for a template Jinja cannot compile, as transformers
    compiles it: at startup, not as every chat request's 400."""
    from jinja2 import TemplateSyntaxError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(template)
    except TemplateSyntaxError as err:
        raise ValueError(f"{source!r} is not a valid Jinja template: {err.message} (line {err.lineno})") from err


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
    """The template to render chats with tools: ``override`` (a template's text) if given,
    the model's own if it shows tools, else the shipped one for the model's chat format."""
    if override:
        return override
    own = hf_tokenizer.chat_template
    if _renders_tools(own, hf_tokenizer):
        return own
    for marker, name in _FORMAT_MARKERS:
        if own and marker in own:
            return SHIPPED[name].read_text()
    raise ValueError("this model's chat template cannot show tools and is not in a format with a shipped tool "
                     "template (ChatML, Llama 3, Mistral); give one that can with --chat-template FILE")


_PROBE_ARGUMENTS = '{"probe_arg_9c1": 1}'


@lru_cache(maxsize=8)
def _quotes_argument_strings(template: str, hf_tokenizer: Any) -> bool:
    """Whether ``template`` needs a call's arguments as an object, as vLLM and SGLang give
    them: it writes them given as a JSON string as a quoted string (``arguments | tojson``
    with no string check, as Qwen2.5's and Llama 3.1's do), or fails on a string (it
    iterates over their items)."""
    def probe(arguments: Any) -> str | None:
        # a 9-character id: Mistral's own templates refuse any other length
        call = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "probe_tool_7f3a", "arguments": arguments}}
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "y"}]
        try:
            return hf_tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], chat_template=template,
                                                    tokenize=False, add_generation_prompt=True)
        except Exception:
            return None

    text = probe(_PROBE_ARGUMENTS)
    if text is None:  # a string fails: objects, if they render
        return probe(json.loads(_PROBE_ARGUMENTS)) is not None
    return json.dumps(_PROBE_ARGUMENTS)[1:-1] in text  # the string's escaped form: {\"probe_arg_9c1\": 1}


def render(hf_tokenizer: Any, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool = True, **kwargs: Any) -> str:
    if any(m.get("tool_calls") for m in messages):
        as_objects = _quotes_argument_strings(template, hf_tokenizer)
        messages = [_with_arguments(m, as_objects) for m in messages]
    return hf_tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=template, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **kwargs)


def _with_arguments(message: dict[str, Any], as_objects: bool) -> dict[str, Any]:
    """``message`` with its calls' arguments as the template takes them: no arguments
    (``""``) as an empty object (as vLLM); JSON objects as objects where ``as_objects``."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    def arguments(text: str) -> Any:
        text = text if text.strip() else "{}"
        return _as_object(text) if as_objects else text
    return {**message, "tool_calls": [{**c, "function": {**c["function"], "arguments": arguments(c["function"]["arguments"])}}
                                      for c in calls]}


def _as_object(arguments: str) -> Any:
    """OpenAI's arguments string as the object it holds; anything else (a list, a number,
    arguments that ``max_tokens`` cut off and a client sends back) stays text, as the model
    wrote it."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments
