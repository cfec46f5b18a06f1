"""SGLang's own frontend package runs a program with ``gen(regex=...)``, ``fork`` and
``select`` against ``forkserve serve``, unchanged.

SGLang runs from a venv of its own (``tests/sglang_venv.py``, the ``sglang_python`` fixture).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.slow

PROGRAM = r'''
import json, sys
import sglang as sgl

@sgl.function
def prog(s):
    s += sgl.user("Give me a date.")
    s += sgl.assistant(sgl.gen("date", regex=r"20\d\d-[01]\d-[0-3]\d", max_tokens=16))
    forks = s.fork(2)
    forks += lambda i: sgl.user(f"Option {i}: is it a weekday?") + sgl.assistant(
        sgl.select("ans", choices=["yes", "no"]))
    forks.join()
    s += sgl.user("Name a colour.") + sgl.assistant(sgl.gen("colour", max_tokens=8, stop="\n"))

sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1]))
state = prog.run(temperature=0)
print(json.dumps({"date": state["date"], "ans": state["ans"], "colour": state["colour"], "text": state.text()}))
'''


def test_sglang_frontend_program_runs_unchanged(sglang_python, server, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run([str(sglang_python), str(script), server.url], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert re.fullmatch(r"20\d\d-[01]\d-[0-3]\d", out["date"])
    assert out["ans"] in (["yes", "yes"], ["yes", "no"], ["no", "yes"], ["no", "no"])
    assert out["text"].count(out["date"]) >= 1 and "Name a colour." in out["text"]
