"""Triton kernels for attention over the paged KV pool (NHD layout, page size 1).

One job per module: ``store_kv`` (write new K/V into their slots), ``decode_attention``
(split-KV decode with a log-sum-exp reduction), ``extend_attention`` (prefill against a
cached prefix), ``kv_indices`` (flatten request-to-token rows into FlashInfer's CSR
indices).

On CPU the kernels run only in Triton's interpreter, which is chosen when a kernel is
decorated: ``TRITON_INTERPRET=1`` must be in the environment before these modules are
imported (and, to be safe, before ``triton`` itself is). The interpreter is slow; it is for
tests, not serving.
"""

from __future__ import annotations

import importlib.util
import os


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set, i.e. kernels decorated now run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
