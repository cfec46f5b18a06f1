"""How each forkserve process logs: ``configure_logging`` once at its start, with the
``--log-level`` of the command. Lines read ``2026-12-05 12:00:01 [forkserve scheduler] ...``
(the process's name in the brackets), so the output of several processes stays readable."""

from __future__ import annotations

import logging

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def configure_logging(process: str, level: str) -> None:
    """Every logger of this process (the root's handler: ours and the libraries') at ``level``
    and above, on stderr. Replaces an earlier setup of this process."""
    logging.basicConfig(level=level.upper(), format=f"%(asctime)s [forkserve {process}] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)
