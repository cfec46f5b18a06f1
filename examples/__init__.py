"""Agent programs written with ``frontend_lang``; each runs with ``python -m examples.<name>``."""
