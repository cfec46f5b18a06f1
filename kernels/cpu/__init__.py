"""The fast CPU path (the ``cpu`` attention backend).

``paged_attention.cpp`` (attention over the paged pool; long bfloat16 extends go to
``attention_amx.cpp`` on AMX tiles), ``elementwise.cpp`` (RMSNorm, rotary, SiLU-and-mul),
``linear_bf16.cpp`` (bfloat16 GEMM on packed weights: AVX512-BF16 vectors, the same with the
weights widened to float32 FMAs, or AMX tiles in ``linear_amx.cpp``, from row counts measured
per machine by ``gemm_choice.py``), ``linear_f32.cpp`` (float32 GEMM on packed weights, on
AVX2 FMAs, for CPUs without AVX-512), ``linear_blocks.cpp`` (the same products of a few rows from weights that are
4-bit affine or 8-bit scaled blocks, as GGUF Q4_1 and Q8_0 dequantize to),
``decoder_layers.cpp`` (all decoder layers in one call, from
``runtime/models/cpu_decoder_layers.py``) and ``machine_probe.cpp`` (the read rate and
multiply-add peaks of ``bench_agent/roofline.py``) are compiled once per machine and loaded
by ``build.py`` (``bf16.h`` and ``simd.h`` hold the shared conversions and vector helpers,
``isa.h`` which instruction sets a build targets (or emulates, for tests: AVX-512 from
SIMDe and ``avx512_emulated.h`` on AVX2-only CPUs), ``amx.h`` the tile configuration (or its
emulation), ``gemm_panel.h`` the GEMMs' panel epilogue,
``online_softmax.h`` the extend paths' softmax step, ``aligned.h`` the 64-byte aligned
buffers the kernels allocate for themselves, ``row_passes.h`` how the three GEMMs
walk a product's rows and share its panels between threads, ``panel_prefetch.h`` how the
float32 GEMMs' tiles prefetch the next panel, ``entries.h`` the entry points one file
calls in another); ``paged_attention.py``, ``elementwise.py``, ``linear_bf16.py``,
``linear_f32.py`` and ``linear_blocks.py`` are their checked Python entry points (``entry_checks.py``: the checks and
the per-dtype lookup the first two share; ``gemm_entry.py``: the GEMMs' call).
``packed_linear.py`` packs linear weights once and picks the GEMM: ours for bfloat16 where
the CPU has AVX512-BF16 and for float32 where it has AVX2 but no AVX-512, oneDNN's
otherwise.
"""
