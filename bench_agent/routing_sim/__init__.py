"""Cache-aware routing without a model: the agent workloads' token streams replayed
through N simulated replicas (each a ``radix_cache.RadixCache`` with its own KV pool)
behind each routing policy of SGLang's model gateway. ``python -m bench_agent.bench_routing``
runs it; see docs/scale.md.

- ``trace.py``: each workload's programs, run by the DSL against a backend that records
  every call and answers with seeded text, tokenized with the model's tokenizer;
- ``policies.py``: the gateway's routing rules (cache-aware, round robin, power of two);
- ``cluster.py``: the replicas' caches and a processor-sharing clock that decides which
  calls are in flight at once.
"""
