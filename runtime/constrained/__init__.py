"""Constrained decoding: output that must match a regex, a JSON schema or an EBNF grammar.

``spec.py`` says which constraint a request has and checks its syntax (a bad one is an
``InvalidField`` before the request is queued); ``backend.py`` is the interface (compile a
spec to a grammar, a grammar to a per-request matcher that fills the allowed-token bitmask
and accepts tokens); ``xgrammar_backend.py`` is the fast implementation, ``reference.py``
a brute-force one for tests; ``grammar_cache.py`` compiles off the scheduler loop and keeps
compiled grammars in an LRU; ``bitmask.py`` applies a bitmask to logits.
"""
