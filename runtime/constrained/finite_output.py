"""Which rules of a grammar can never end: those with no finite derivation (``root ::= "a"
root``, or a JSON schema whose required property is the schema itself). A matcher can enter
such a rule, and where its only continuation is forced, xgrammar's jump-forward string is
endless: it grew the scheduler by gigabytes a second until the system killed it. So a
grammar (or schema) with a reachable rule that cannot end is refused when it is compiled.

Read from xgrammar's normalized EBNF (``str(grammar)``): rules ``name ::= body``, bodies of
``|`` choices, sequences, groups, strings, character classes, rule names, quantifiers (``*``
``+`` ``?`` ``{m, n}``), look-aheads ``(= ...)`` and built-ins such as ``Regex(...)`` (taken
as able to end). Text it cannot read gives no verdict (nothing refused)."""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r"""\s+|"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]"""  # space, string, character class
    r"""|[A-Za-z_]\w*\((?:"(?:\\.|[^"\\])*"|[^()"])*\)"""  # a built-in: Regex("...", ...)
    r"""|[A-Za-z_]\w*|\(=|[()|*+?]|\{\s*\d+\s*,\s*-?\d+\s*\}"""
)
_RULE = re.compile(r"^([A-Za-z_]\w*) ::= (.*)$")

# A parsed body: ("or", [seq, ...]), ("seq", [item, ...]), ("opt", node) for an item that may
# be left out, ("ref", name), ("end",) for what always ends (text, a class, a built-in).
Node = tuple[Any, ...]


class _Unreadable(Exception):
    pass


def unending_rules(ebnf: str, root: str = "root") -> list[str]:
    """The rules reachable from ``root`` that have no finite derivation, in order of
    appearance ([] where there are none, or where ``ebnf`` cannot be read)."""
    try:
        rules = {}
        for line in ebnf.splitlines():
            if line.strip():
                match = _RULE.match(line.strip())
                if match is None:
                    raise _Unreadable(line)
                rules[match.group(1)] = _parse(match.group(2))
    except _Unreadable:
        return []
    if root not in rules:
        return []
    ending: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in ending and _ends(body, ending, rules):
                ending.add(name)
                changed = True
    reachable, todo = {root}, [root]
    while todo:
        for name in _refs(rules[todo.pop()]):
            if name in rules and name not in reachable:
                reachable.add(name)
                todo.append(name)
    return [name for name in rules if name in reachable and name not in ending]


def _ends(node: Node, ending: set[str], rules: dict[str, Node]) -> bool:
    kind = node[0]
    if kind == "or":
        return any(_ends(n, ending, rules) for n in node[1])
    if kind == "seq":
        return all(_ends(n, ending, rules) for n in node[1])
    if kind == "ref":
        return node[1] in ending or node[1] not in rules  # (a name it does not define: no verdict)
    return True  # "end", "opt"


def _refs(node: Node) -> list[str]:
    kind = node[0]
    if kind in ("or", "seq"):
        return [name for n in node[1] for name in _refs(n)]
    if kind == "opt":
        return _refs(node[1])
    return [node[1]] if kind == "ref" else []


def _parse(body: str) -> Node:
    tokens = [t for t in _tokens(body) if not t.isspace()]
    node, at = _choice(tokens, 0)
    if at < len(tokens) and tokens[at] == "(=":  # the rule's look-ahead: no part of its text
        _, at = _group(tokens, at)
    if at != len(tokens):
        raise _Unreadable(body)
    return node


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise _Unreadable(text[at:])
        out.append(match.group())
        at = match.end()
    return out


def _choice(tokens: list[str], at: int) -> tuple[Node, int]:
    options = []
    while True:
        items = []
        while at < len(tokens) and tokens[at] not in ("|", ")"):
            if tokens[at] == "(=" and items:  # a look-ahead after a sequence: matches nothing
                _, at = _group(tokens, at)
                continue
            item, at = _item(tokens, at)
            items.append(item)
        options.append(("seq", items))
        if at < len(tokens) and tokens[at] == "|":
            at += 1
            continue
        return ("or", options), at


def _item(tokens: list[str], at: int) -> tuple[Node, int]:
    token = tokens[at]
    if token in ("(", "(="):
        atom, at = _group(tokens, at)
        if token == "(=":
            atom = ("end",)
    elif token[0] in "\"[" or token.endswith(")"):
        atom, at = ("end",), at + 1
    elif re.fullmatch(r"[A-Za-z_]\w*", token):
        atom, at = ("ref", token), at + 1
    else:
        raise _Unreadable(token)
    if at < len(tokens) and (tokens[at] in ("*", "?") or re.fullmatch(r"\{\s*0\s*,.*", tokens[at])):
        return ("opt", atom), at + 1
    if at < len(tokens) and (tokens[at] == "+" or tokens[at].startswith("{")):
        return atom, at + 1
    return atom, at


def _group(tokens: list[str], at: int) -> tuple[Node, int]:
    node, at = _choice(tokens, at + 1)
    if at >= len(tokens) or tokens[at] != ")":
        raise _Unreadable(" ".join(tokens))
    return node, at + 1
