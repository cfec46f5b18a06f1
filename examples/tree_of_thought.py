"""Tree of thought: branch ``width`` ways at each of ``depth`` levels, then a judge scores
every leaf and the best path wins.

    python -m examples.tree_of_thought [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import frontend_lang as sgl
from examples._scores import SCORES


@sgl.function
def tree_of_thought(s, question: str, width: int = 2, depth: int = 2):
    s += sgl.system("You solve problems step by step.")
    s += sgl.user(question)
    leaves = [s]
    for level in range(depth):
        grown = []
        for leaf in leaves:
            branches = leaf.fork(width)
            branches += lambda i, level=level: sgl.assistant(
                f"Idea {level + 1}.{i + 1}: " + sgl.gen("thought", max_tokens=40, stop="\n")
            ) + sgl.user("Go one step further.")
            grown.extend(branches)
        leaves = grown
    for leaf in leaves:
        leaf += sgl.assistant(sgl.gen("conclusion", max_tokens=40, stop="\n"))
        leaf += sgl.user("How good is this reasoning, from 1 to 9? Reply with the number only.")
        leaf += sgl.assistant(sgl.select("score", SCORES))
    scores = [int(leaf["score"]) for leaf in leaves]
    best = max(range(len(leaves)), key=lambda i: scores[i])
    s += sgl.user("The best line of reasoning was:\n" + leaves[best]["conclusion"])
    return {"scores": scores, "best": best, "conclusions": [leaf["conclusion"] for leaf in leaves]}


def main() -> None:
    from examples._cli import GENERATES_MID_TURN, backend_from_args

    backend, _ = backend_from_args(__doc__ or "", GENERATES_MID_TURN)
    state = tree_of_thought.run(question="How can a city reduce traffic jams?", temperature=0, backend=backend)
    result = state.ret_value
    for i, (score, text) in enumerate(zip(result["scores"], result["conclusions"], strict=True)):
        mark = "  <- best" if i == result["best"] else ""
        print(f"leaf {i} (score {score}): {text}{mark}")
    backend.shutdown()


if __name__ == "__main__":
    main()
