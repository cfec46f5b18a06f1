"""The fast CPU path (the ``cpu`` attention backend).

``paged_attention.cpp`` (attention over the paged pool) and ``elementwise.cpp`` (RMSNorm,
rotary, SiLU-and-mul) are compiled once per machine and loaded by ``build.py``;
``paged_attention.py`` and ``elementwise.py`` are their checked Python entry points.
``packed_linear.py`` runs linear layers on weights pre-packed for oneDNN (no compiling).
"""
