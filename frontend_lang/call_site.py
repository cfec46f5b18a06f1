"""Where a program appended an expression: errors name the program's own line."""

from __future__ import annotations

import os
import traceback

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def caller_line() -> str:
    """``file:line: code`` of the program line that appended the expression."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR + os.sep) and "contextlib" not in frame.filename:
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "<unknown>"
