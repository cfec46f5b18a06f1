"""Tool calling on the OpenAI chat route: parsers that turn generated text into
``message.tool_calls`` (``parsers.py``)."""
