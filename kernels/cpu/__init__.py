"""Compiled C++ kernels for the CPU path (the ``cpu`` attention backend).

``paged_attention.cpp`` is the kernel, ``build.py`` compiles it once per machine and loads
it, ``paged_attention.py`` is the checked Python entry point.
"""
