"""LLM as a judge: one branch per rubric dimension, each with a short judgement and a
1-9 score, then a verdict.

    python -m examples.llm_judge [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import frontend_lang as sgl
from examples._scores import SCORES

DIMENSIONS = ["clarity", "accuracy", "completeness", "tone"]


@sgl.function
def llm_judge(s, question: str, answer: str, dimensions: list[str] = DIMENSIONS):
    s += sgl.system("You are a strict reviewer of answers.")
    s += sgl.user_begin() + f"Question: {question}\nAnswer: {answer}\n\n"
    branches = s.fork(len(dimensions))
    branches += lambda i: (
        f"In one sentence, how good is this answer's {dimensions[i]}?"
        + sgl.user_end()
        + sgl.assistant(sgl.gen("judgement", max_tokens=40))
        + sgl.user(f"Score its {dimensions[i]} from 1 to 9. Reply with the number only.")
        + sgl.assistant(sgl.select("score", SCORES))
    )
    branches.join()
    scores = [int(x) for x in s["score"]]
    s += "Rate it." + sgl.user_end()
    s += sgl.assistant(", ".join(f"{d}: {v}/9" for d, v in zip(dimensions, scores, strict=True)))
    s += sgl.user("Give a one-sentence verdict.")
    s += sgl.assistant(sgl.gen("verdict", max_tokens=40))
    return dict(zip(dimensions, scores, strict=True))


def main() -> None:
    from examples._cli import NEEDS_LOGPROBS, backend_from_args

    backend, _ = backend_from_args(__doc__ or "", NEEDS_LOGPROBS)
    state = llm_judge.run(
        question="Why do we have seasons?",
        answer="Because the Earth's axis is tilted, so each hemisphere gets more direct sunlight for part of the year.",
        temperature=0,
        backend=backend,
    )
    for dim, judgement, score in zip(DIMENSIONS, state["judgement"], state["score"], strict=True):
        print(f"{dim:>12}: {score}/9  {judgement}")
    print(f"\nverdict: {state['verdict']}")
    backend.shutdown()


if __name__ == "__main__":
    main()
