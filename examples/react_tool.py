"""ReAct through real tool calls: the model calls ``lookup`` (a deterministic local tool)
through tool calling, reads each result as a tool message, and answers when it has what it
needs (or after ``max_steps`` calls). The first step must call (``tool_choice: "required"``),
later ones may answer instead (``auto``).

    python -m examples.react_tool                                   # the engine in this process
    python -m examples.react_tool --url http://127.0.0.1:30000      # a server's native API
    python -m examples.react_tool --url http://127.0.0.1:30000 --openai   # its OpenAI chat API
"""

from __future__ import annotations

import frontend_lang as sgl

FACTS = {
    "france": "The capital of France is Paris.",
    "paris": "Paris has about 2.1 million inhabitants.",
    "japan": "The capital of Japan is Tokyo.",
    "tokyo": "Tokyo has about 14 million inhabitants.",
}
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "A fact about a topic (a country or a city)",
    "parameters": {"type": "object", "properties": {"topic": {"type": "string", "maxLength": 30}},
                   "required": ["topic"], "additionalProperties": False}}}


def lookup(topic: str) -> str:
    """The tool: a fixed table, so runs are reproducible."""
    key = topic.strip().lower()
    for name, fact in FACTS.items():
        if name in key:
            return fact
    return f"No fact about {topic.strip()!r}."


@sgl.function
def react(s, question: str, max_steps: int = 3):
    s += sgl.system("Answer the question. Look facts up with the lookup tool, one topic at a time, "
                    "then answer in one sentence.")
    s += sgl.user(question)
    for i in range(max_steps):
        s += sgl.assistant(sgl.gen(f"step_{i}", max_tokens=64, tools=[LOOKUP], parallel_tool_calls=False,
                                   tool_choice="required" if i == 0 else "auto"))
        calls = s[f"step_{i}"]
        if not calls:  # the model answered instead of calling
            return s.get_meta_info(f"step_{i}")["content"]
        for call in calls:
            s += sgl.tool(lookup(call.args["topic"]), call.id)
    s += sgl.assistant(sgl.gen("answer", max_tokens=48, tools=[LOOKUP], tool_choice="none"))
    return s["answer"]


def main() -> None:
    from examples._cli import backend_from_args

    backend, _ = backend_from_args(__doc__ or "")
    state = react.run(question="How many people live in the capital of France?", temperature=0, backend=backend)
    for m in state.messages():
        print(f"{m['role']}: {m.get('content')!r}" + (f" calls {m['tool_calls']}" if m.get("tool_calls") else ""))
    print(f"final answer: {state.ret_value}")
    backend.shutdown()


if __name__ == "__main__":
    main()
