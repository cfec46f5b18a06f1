"""Deterministic synthetic text: agent-like English from a seed, no datasets.

Every benchmark prompt comes from here, so a workload with the same seed and sizes sends
the same text to every backend. Lengths are given in approximate tokens (the default
model's tokenizer spends about 1.2 tokens per word of this vocabulary); results report the
exact counts the server saw.
"""

from __future__ import annotations

import random

_NOUNS = ["agent", "plan", "tool", "result", "file", "test", "function", "value", "table", "report", "user", "query", "answer", "step", "error", "budget", "cache", "server", "request", "model", "branch", "score", "draft", "review", "summary", "list", "record", "task", "goal", "metric", "city", "river", "market", "team", "project", "policy", "price", "garden", "station", "library"]
_VERBS = ["reads", "writes", "checks", "updates", "returns", "compares", "sorts", "explains", "finds", "keeps", "sends", "builds", "measures", "improves", "describes", "removes", "tracks", "opens", "closes", "plans"]
_ADJECTIVES = ["new", "old", "short", "long", "small", "large", "careful", "quick", "simple", "clear", "exact", "recent", "local", "shared"]
_LINKS = ["and", "then", "but", "so", "because", "while", "after", "before"]

TOKENS_PER_WORD = 1.2


def sentence(rng: random.Random, words: int) -> str:
    """One sentence of about ``words`` words."""
    out: list[str] = []
    while len(out) < words:
        out += ["the", rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS), "a", rng.choice(_NOUNS)]
        if len(out) < words:
            out.append(rng.choice(_LINKS))
    out = out[:words]
    return " ".join(out).capitalize() + "."


def text(rng: random.Random, tokens: int) -> str:
    """A paragraph of about ``tokens`` tokens."""
    words = max(1, round(tokens / TOKENS_PER_WORD))
    parts: list[str] = []
    while words > 0:
        n = min(words, rng.randint(8, 16))
        parts.append(sentence(rng, n))
        words -= n
    return " ".join(parts)


def rng_for(*key: object) -> random.Random:
    """A generator seeded by ``key`` (e.g. workload seed, program index), stable across runs
    and Python processes (``hash`` of a str is salted per process, so it is not used)."""
    return random.Random("/".join(map(str, key)))
