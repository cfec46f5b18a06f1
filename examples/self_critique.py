"""Self-critique: propose, critique with a 1-9 score, revise, until the score is high
enough (a ``select`` over the scores) or the rounds run out.

    python -m examples.self_critique [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import frontend_lang as sgl
from examples._scores import SCORES


@sgl.function
def self_critique(s, task: str, max_rounds: int = 2, good_enough: int = 7):
    s += sgl.system("You are a careful writer. You critique and improve your own drafts.")
    s += sgl.user(f"Task: {task}\nWrite a first draft in two sentences.")
    s += sgl.assistant(sgl.gen("draft_0", max_tokens=64))
    for r in range(max_rounds):
        s += sgl.user("Critique the draft in one sentence.")
        s += sgl.assistant(sgl.gen(f"critique_{r}", max_tokens=48))
        s += sgl.user("Score the draft from 1 to 9. Reply with the number only.")
        s += sgl.assistant(sgl.select(f"score_{r}", SCORES))
        if int(s[f"score_{r}"]) >= good_enough:
            return r + 1  # critique rounds run
        s += sgl.user("Rewrite the draft to fix that, in two sentences.")
        s += sgl.assistant(sgl.gen(f"draft_{r + 1}", max_tokens=64))
    return max_rounds


def main() -> None:
    from examples._cli import NEEDS_LOGPROBS, backend_from_args

    backend, _ = backend_from_args(__doc__ or "", NEEDS_LOGPROBS)
    state = self_critique.run(task="Explain why the sky is blue to a child.", temperature=0, backend=backend)
    for m in state.messages():
        print(f"[{m['role']}] {m['content']}\n")
    backend.shutdown()
    if state.error() is not None:
        raise SystemExit(f"the program failed: {state.error()}")
    print(f"rounds used: {state.ret_value}")


if __name__ == "__main__":
    main()
