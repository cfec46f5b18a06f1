"""ReAct: think, pick a tool with ``select``, call a deterministic local tool, observe,
until the program picks ``finish``.

    python -m examples.react_tool [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import frontend_lang as sgl

FACTS = {
    "france": "The capital of France is Paris.",
    "paris": "Paris has about 2.1 million inhabitants.",
    "japan": "The capital of Japan is Tokyo.",
    "tokyo": "Tokyo has about 14 million inhabitants.",
}

INSTRUCTIONS = """Answer the question. Each step has a Thought and an Action.
Actions: lookup[topic] returns a fact about the topic; finish[answer] gives the final answer.

Question: What is the capital of Japan?
Thought 1: I should look up Japan.
Action 1: lookup[Japan]
Observation 1: The capital of Japan is Tokyo.
Thought 2: The capital is Tokyo.
Action 2: finish[Tokyo]

"""


def lookup(topic: str) -> str:
    """The tool: a fixed table, so runs are reproducible."""
    key = topic.strip().lower()
    for name, fact in FACTS.items():
        if name in key:
            return fact
    return f"No fact about {topic.strip()!r}."


@sgl.function
def react(s, question: str, max_steps: int = 3):
    s += INSTRUCTIONS + f"Question: {question}\n"
    for i in range(1, max_steps + 1):
        s += f"Thought {i}:" + sgl.gen(f"thought_{i}", max_tokens=32, stop=["\n", "Action"]) + "\n"
        s += f"Action {i}: " + sgl.select(f"tool_{i}", ["lookup", "finish"]) + "["
        s += sgl.gen(f"arg_{i}", max_tokens=12, stop=["]", "\n"]) + "]\n"
        if s[f"tool_{i}"] == "finish":
            return s[f"arg_{i}"]
        s += f"Observation {i}: {lookup(s[f'arg_{i}'])}\n"
    return None


def main() -> None:
    from examples._cli import backend_from_args

    backend, _ = backend_from_args(__doc__ or "")
    state = react.run(question="How many people live in the capital of France?", temperature=0, backend=backend)
    print(state.text())
    print(f"final answer: {state.ret_value}")
    backend.shutdown()


if __name__ == "__main__":
    main()
