"""The tools and question both tool-call test modules ask with (test_structured_output.py,
test_native_tools.py)."""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
WEATHER = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def streamed_calls(choices: list[dict]) -> list[dict]:
    """The tool calls of one streamed choice (its chunks' `choices[0]`), added up as OpenAI's
    clients do: a call's first piece has its id, type and name, the rest only more arguments."""
    calls: list[dict] = []
    for choice in choices:
        for piece in choice["delta"].get("tool_calls") or []:
            if piece["index"] == len(calls):
                assert piece["id"] and piece["type"] == "function" and piece["function"]["name"], piece
                calls.append({"id": piece["id"], "type": "function",
                              "function": {"name": piece["function"]["name"], "arguments": ""}})
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}, piece
            calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
    return calls
