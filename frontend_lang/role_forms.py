"""The role and ``var_scope`` forms of a program state (``with s.user():``, ``s.user(expr)``,
``with s.var_scope(name):``), in terms of the state's ``submit``: shared by a running
state and the recording state ``prog.cache()`` traces with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from frontend_lang.call_site import caller_line
from frontend_lang.ir import Expr, ExprList, RoleBegin, RoleEnd, VarScope, as_expr


class RoleForms:
    def submit(self, expr: Expr, where: str) -> None:
        """Append ``expr`` (appended at program line ``where``)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        where = caller_line()
        self.submit(RoleBegin(role), where)
        yield
        self.submit(RoleEnd(role), where)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """``with s.var_scope("answer"): s += ...``: the text appended inside becomes
        variable ``name`` (as SGLang's)."""
        where = caller_line()
        self.submit(VarScope(name, begin=True), where)
        yield
        self.submit(VarScope(name, begin=False), where)

    def system(self, expr: Any = None) -> contextlib.AbstractContextManager[None] | None:
        """``with s.system(): ...`` opens the turn; ``s.system(expr)`` appends a whole one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> contextlib.AbstractContextManager[None] | None:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> contextlib.AbstractContextManager[None] | None:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Any) -> contextlib.AbstractContextManager[None] | None:
        if expr is None:
            return self._role_scope(role)
        self.submit(ExprList([RoleBegin(role), as_expr(expr), RoleEnd(role)]), caller_line())
        return None
