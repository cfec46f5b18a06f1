"""The fast CPU path (the ``cpu`` attention backend).

``paged_attention.cpp`` (attention over the paged pool), ``elementwise.cpp`` (RMSNorm,
rotary, SiLU-and-mul) and ``linear_bf16.cpp`` (bfloat16 GEMM on packed weights) are compiled
once per machine and loaded by ``build.py`` (``bf16.h`` and ``simd.h`` hold the shared
conversions and AVX-512 helpers); ``paged_attention.py``, ``elementwise.py`` and
``linear_bf16.py`` are their checked Python entry points (``entry_checks.py``: the checks
and the per-dtype lookup they share). ``packed_linear.py`` packs linear
weights once and picks the GEMM: ours for bfloat16 where the CPU has AVX512-BF16, oneDNN's
otherwise.
"""
