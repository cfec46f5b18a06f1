"""A chat request's prompt: its messages rendered through the chat template (one that can show
tools when the request has tools or its history has tool turns) and, when the answer may hold
tool calls, the parser that reads them and the grammar that keeps them valid. No HTTP here:
the chat route, its render route and the DSL's in-process backend all build prompts with it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runtime.sampling.params import InvalidField
from runtime.server.tools.choice import call_rule
from runtime.server.tools.constraint import tool_grammar
from runtime.server.tools.parsers import ToolCallParser, get_parser
from runtime.server.tools.template import render, tool_template


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    # set when the answer may hold calls: tools given and tool_choice not "none"
    tool_parser: ToolCallParser | None = None
    tool_ebnf: str | None = None  # None: nothing enforced
    # false where the template's thinking switch was turned off: the answer has no reasoning
    # to split off (the reasoning parser would take a whole answer without its end marker)
    thinking: bool = True


# Arguments of the render itself: in ``chat_template_kwargs`` they are dropped (the request's
# own fields win, as in vLLM) instead of clashing with ours.
RENDER_ARGUMENTS = frozenset({"add_generation_prompt", "continue_final_message", "tools", "tokenize", "chat_template",
                              "conversation", "messages", "return_dict"})
# The switches reasoning models' chat templates read to think or not (Qwen3's, DeepSeek's).
THINKING_SWITCHES = ("enable_thinking", "thinking")


def thinking_switch(template: str) -> str | None:
    """The thinking switch ``template`` reads (as a variable inside a Jinja tag), if any."""
    return next((name for name in THINKING_SWITCHES
                 if re.search(r"\{[{%][^}]*(?<![\w.'\"])" + name + r"(?![\w'\"])", template)), None)


def render_chat(
    hf_tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    chat_template: str | None = None,
    tool_call_parser: str = "auto",
    other_constraint: bool = False,
    answer_schema: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    reasoning_effort: str | None = None,
    reasoning_model: bool = False,
) -> ChatPrompt:
    """The prompt for ``messages`` (template dicts, OpenAI's shape) and ``tools``;
    ``chat_template`` (a template's text, ``--chat-template``) replaces the model's.
    ``answer_schema``: the JSON schema an answer without calls must follow (the grammar then
    allows calls or that JSON). Raises ``InvalidField`` naming ``messages`` (the template
    refused them), ``tools`` (tools together with ``other_constraint``, a regex or grammar
    constraint), ``tool_choice`` or ``reasoning_effort``. ``reasoning_effort`` goes to a
    template that reads it; for a model that does not reason (``reasoning_model`` false: no
    reasoning parser) any effort holds as it is, with no reasoning; ``none`` sets a template's
    thinking switch (``enable_thinking``, ``thinking``) off; a reasoning model whose template
    has neither cannot honour it (a 400)."""
    rule = call_rule(tools, tool_choice)
    uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    kwargs = {k: v for k, v in (template_kwargs or {}).items() if k not in RENDER_ARGUMENTS}
    kwargs.update(add_generation_prompt=add_generation_prompt and not continue_final_message,
                  continue_final_message=continue_final_message)
    try:
        template = tool_template(hf_tokenizer, chat_template) if uses_tools else (chat_template or hf_tokenizer.chat_template)
        if not template:
            raise ValueError("this model has no chat template; use completions instead of chat")
        switch = thinking_switch(template)
        if reasoning_effort is not None and "reasoning_effort" in template:
            kwargs["reasoning_effort"] = reasoning_effort
        elif reasoning_effort == "none" and switch is not None:  # as SGLang: thinking off by the template's switch
            kwargs.setdefault(switch, False)
        elif reasoning_effort is not None and reasoning_model:
            raise InvalidField("reasoning_effort", "reasoning_effort is not supported by this model: its chat "
                                                   "template does not read it (chat_template_kwargs may have a "
                                                   "switch of its own, e.g. enable_thinking)")
        text = render(hf_tokenizer, template, messages, tools, **kwargs)
        thinking = not (switch is not None and kwargs.get(switch) is False)
    except InvalidField:
        raise
    except ValueError as err:
        raise InvalidField("messages", str(err)) from err
    except Exception as err:  # jinja errors name the template's complaint
        raise InvalidField("messages", f"the chat template rejected the messages: {err}") from err
    if rule.mode == "none":
        return ChatPrompt(text, thinking=thinking)
    if other_constraint:
        raise InvalidField("tools", "tools cannot be combined with another output constraint")
    parser = get_parser(tool_call_parser, template)
    ebnf = tool_grammar(tools, tool_choice, parser.name, parallel=parallel_tool_calls is not False,
                        answer_schema=answer_schema)
    return ChatPrompt(text, parser, ebnf, thinking)
