"""How each forkserve process logs: ``configure_logging`` once at its start, with the
``--log-level`` of the command. Lines read ``2026-12-05 12:00:01 [forkserve scheduler] ...``
(the process's name in the brackets), so the output of several processes stays readable.
forkserve's own loggers (``forkserve`` and below) log at that level; the libraries' (torch,
httpx, ...) only warnings and errors, whose info lines would be noise here."""

from __future__ import annotations

import logging

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
OWN_LOGGER = "forkserve"


def configure_logging(process: str, level: str) -> None:
    """This process's log lines on stderr, replacing an earlier setup of it."""
    logging.basicConfig(format=f"%(asctime)s [forkserve {process}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        force=True)
    set_log_level(level)


def set_log_level(level: str) -> None:
    """forkserve's loggers at ``level``, the libraries' at ``level`` or warning, the higher."""
    number = logging.getLevelName(level.upper())
    logging.getLogger().setLevel(max(number, logging.WARNING))
    logging.getLogger(OWN_LOGGER).setLevel(number)
