"""What a program appends to its state: text, ``gen``, ``select`` and role markers.

``s += "text" + gen("x")`` builds a list of these; the state's executor runs them in order.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from frontend_lang.choices import ChoicesMethod, token_length_normalized
from frontend_lang.tools import ToolUse, tool_use
from runtime.server.reasoning import PARSERS as REASONING_PARSERS

ROLES = ("system", "user", "assistant")


class Expr:
    def __add__(self, other: Any) -> ExprList:
        return ExprList([self, as_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([as_expr(other), self])

    def describe(self) -> str:
        return type(self).__name__.lower()


@dataclass
class Constant(Expr):
    text: str

    def describe(self) -> str:
        short = self.text if len(self.text) <= 30 else self.text[:27] + "..."
        return f"text {short!r}"


@dataclass
class Gen(Expr):
    name: str | None
    sampling: dict[str, Any]  # native sampling-parameter names; None means "the run's default"
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    tools: ToolUse | None = None  # a tool-calling gen (see frontend_lang/tools.py)
    reasoning: str | None = None  # separate_reasoning's parser: the think part goes to its own variable

    def describe(self) -> str:
        return f"gen({self.name!r})"


@dataclass
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float = 0.0
    choices_method: ChoicesMethod = token_length_normalized
    reasoning: str | None = None  # as Gen's

    def describe(self) -> str:
        return f"select({self.name!r})"


@dataclass
class VarScope(Expr):
    """``with s.var_scope(name):`` begins (``begin``) or ends: the text appended between
    becomes variable ``name``."""

    name: str
    begin: bool

    def describe(self) -> str:
        return f"var_scope({self.name!r}) {'begin' if self.begin else 'end'}"


@dataclass
class ToolResult(Expr):
    """A tool call's result, given back as a ``tool`` message."""

    content: str
    tool_call_id: str

    def describe(self) -> str:
        return f"tool({self.tool_call_id!r})"


@dataclass
class RoleBegin(Expr):
    role: str

    def describe(self) -> str:
        return f"{self.role}() begin"


@dataclass
class RoleEnd(Expr):
    role: str

    def describe(self) -> str:
        return f"{self.role}() end"


@dataclass
class ExprList(Expr):
    items: list[Expr] = field(default_factory=list)

    def __post_init__(self) -> None:
        flat: list[Expr] = []
        for item in self.items:
            flat.extend(item.items if isinstance(item, ExprList) else [item])
        self.items = flat


def as_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Constant(value)
    raise TypeError(f"cannot append {type(value).__name__} to a program state; use a str, gen(), select() or a role")


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: Iterable[str] | None = None,
    choices_method: ChoicesMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | type | None = None,
    *,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    parallel_tool_calls: bool | None = None,
) -> Expr:
    """Generate text into variable ``name``. With ``choices`` it is ``select``.

    ``regex`` / ``json_schema`` (a JSON string, a dict or a pydantic model class) constrain
    the output; ``dtype`` (``int``, ``float``, ``bool`` or ``str``) is a shorthand for a
    regex of that type's literal (a number also ended by a space or newline, as in SGLang). The variable
    holds the text either way. With ``tools`` (OpenAI's function tools, ``tool_choice``,
    ``parallel_tool_calls``) the gen is a whole assistant turn that may call them, and the
    variable holds the calls (``frontend_lang/tools.py``). With ``n`` > 1 (as SGLang's) the
    variable holds ``n`` samples of one request and the text goes on with the first.

    The parameters up to ``json_schema`` are SGLang's, in its order (a program may pass them
    by position); forkserve's own come after and are keyword-only."""
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"gen(): n must be a positive integer, got {n!r}")
    uses = tool_use(tools, tool_choice, parallel_tool_calls)
    if uses is not None and (choices is not None or dtype is not None or regex is not None or json_schema is not None
                             or (n or 1) > 1):
        raise ValueError("gen(): tools cannot be combined with choices, dtype, regex, json_schema or n > 1")
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    if regex is not None:  # a pattern Python cannot compile fails here, as in SGLang
        try:
            re.compile(regex)
        except re.error as err:
            raise ValueError(f"gen(): regex {regex!r} is not a valid regular expression: {err}") from err
    if dtype is not None:
        if json_schema is not None:
            raise ValueError("gen(): give one of json_schema and dtype")
        if regex is not None:  # SGLang's rule: dtype wins, with a warning
            warnings.warn(f"gen(): both dtype and regex are set; only dtype ({dtype!r}) is used", stacklevel=2)
            regex = None
        dtype = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype  # SGLang takes "int" too
        if dtype not in DTYPE_REGEX:
            raise ValueError(f"gen(): dtype must be one of int, float, bool, str; got {dtype!r}")
        regex = DTYPE_REGEX[dtype]
        if dtype in (int, float):  # a number ends at a space or newline; a quoted str may hold spaces
            stop = [*([stop] if isinstance(stop, str) else stop or []), " ", "\n"]
    sampling = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": min_tokens,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "stop_regex": stop_regex,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "repetition_penalty": repetition_penalty,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "n": n,
        "regex": regex,
        "json_schema": _schema_text(json_schema),
    }
    return Gen(name, sampling, return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs, uses)


def tool(content: str, tool_call_id: str) -> ToolResult:
    """Give the result of call ``tool_call_id`` (``ToolCall.id``) back to the model, between turns."""
    if not isinstance(content, str) or not isinstance(tool_call_id, str) or not tool_call_id:
        raise ValueError("tool(): content must be a string and tool_call_id a call's id")
    return ToolResult(content, tool_call_id)


def select(
    name: str | None = None, choices: Iterable[str] | None = None, temperature: float = 0.0,
    choices_method: ChoicesMethod | None = None,
) -> Select:
    """Append the best choice by ``choices_method`` (default: the highest
    token-length-normalised logprob; see ``frontend_lang/choices.py``). Greedy only."""
    given = [] if choices is None or isinstance(choices, str) else list(choices)  # any iterable of strings
    if not given or not all(isinstance(c, str) for c in given):
        raise ValueError("select(): choices must be a non-empty list of strings")
    if "" in given:  # it has no token of its own to score
        raise ValueError("select(): an empty choice cannot be scored: every choice needs text")
    if temperature > 1e-5:
        raise ValueError("select(): only temperature 0 is supported (the choice is an argmax)")
    method = token_length_normalized if choices_method is None else choices_method
    if not isinstance(method, ChoicesMethod):
        raise ValueError(f"select(): choices_method must be one of the frontend_lang choices methods, got {method!r}")
    return Select(name, given, temperature, method)


_DTYPE_NAMES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}

# gen(dtype=...): a literal of the type, optionally followed by the space or newline that ends it
DTYPE_REGEX: dict[type, str] = {
    int: r"[-+]?[0-9]+[ \n]?",
    float: r"[-+]?([0-9]+(\.[0-9]+)?|\.[0-9]+)[ \n]?",
    bool: r"(True|False)",
    str: r"\"[^\"\n]*\"",
}


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Expr:
    """SGLang's: each named gen / select in ``expr`` has the reasoning a reasoning model
    writes (up to its ``</think>``) split off into variable ``{name}_reasoning_content``; the
    variable and the program's text keep the rest. ``model_type`` names the parser, as the
    server's ``--reasoning-parser``: ``deepseek-r1`` (the template opens the thinking) or
    ``qwen3`` (the model writes ``<think>``)."""
    if model_type not in REASONING_PARSERS:
        raise ValueError(f"separate_reasoning(): model_type must be one of {', '.join(REASONING_PARSERS)}, "
                         f"got {model_type!r}")
    if expr is None:
        return ExprList([])
    return _with_reasoning(as_expr(expr), model_type)


def _with_reasoning(expr: Expr, model_type: str) -> Expr:
    if isinstance(expr, ExprList):
        return ExprList([_with_reasoning(item, model_type) for item in expr.items])
    if isinstance(expr, (Gen, Select)):
        if not expr.name:
            raise ValueError("separate_reasoning(): the gen or select needs a name (its reasoning goes to "
                             "'<name>_reasoning_content')")
        if isinstance(expr, Gen) and expr.tools is not None:
            raise ValueError("separate_reasoning(): a gen with tools is a chat turn; the server's "
                             "--reasoning-parser splits its reasoning")
        return dataclasses.replace(expr, reasoning=model_type)
    return expr


def reasoning_name(name: str) -> str:
    """The variable that holds ``name``'s reasoning (SGLang's naming)."""
    return f"{name}_reasoning_content"


def image(path: str) -> Expr:
    """SGLang's image input: refused, the models served here read text only."""
    raise ValueError("sgl.image(): images are not supported: the models served here read text only")


def video(path: str, num_frames: int = -1) -> Expr:
    """SGLang's video input: refused, the models served here read text only."""
    raise ValueError("sgl.video(): videos are not supported: the models served here read text only")


# gen_int / gen_string's parameters after the name, in SGLang's order (a program may pass
# them by position); each is gen()'s parameter of that name.
_TYPED_GEN_ORDER = (
    "max_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs",
)


def gen_int(name: str | None = None, *args: Any, **kwargs: Any) -> Expr:
    """``gen(name, ..., dtype=int)``; positional arguments after the name in SGLang's order:
    max_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
    frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
    top_logprobs_num, return_text_in_logprobs."""
    return gen(name, **_typed_gen_args("gen_int", args, kwargs), dtype=int)


def gen_string(name: str | None = None, *args: Any, **kwargs: Any) -> Expr:
    """``gen(name, ..., dtype=str)``, with ``gen_int``'s positional arguments."""
    return gen(name, **_typed_gen_args("gen_string", args, kwargs), dtype=str)


def _typed_gen_args(caller: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    if len(args) > len(_TYPED_GEN_ORDER):
        raise TypeError(f"{caller}() takes at most {len(_TYPED_GEN_ORDER) + 1} positional arguments")
    named = dict(zip(_TYPED_GEN_ORDER, args, strict=False))
    if twice := sorted(set(named) & set(kwargs)):
        raise TypeError(f"{caller}() got multiple values for argument {twice[0]!r}")
    return {**named, **kwargs}


def _schema_text(schema: str | dict[str, Any] | type | None) -> str | None:
    """A JSON schema as JSON text, from text, a dict or a pydantic model class."""
    if schema is None or isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise ValueError(f"json_schema must be JSON text, a dict or a pydantic model class, got {type(schema).__name__}")


def _role(role: str, expr: Any = None) -> ExprList:
    inner = [] if expr is None else [as_expr(expr)]
    return ExprList([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Any = None) -> ExprList:
    return _role("system", expr)


def user(expr: Any = None) -> ExprList:
    return _role("user", expr)


def assistant(expr: Any = None) -> ExprList:
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
