"""An agent program as users write them for any OpenAI-compatible server: it owns its tool loop, and `grpo` trains
the model it talks to (recipes/agent-openai.yaml). It asks the row's question with a calculator tool, runs the calls
the model writes, and reports 1.0 when its final answer is the row's answer."""

import importlib.util
import json
import re
from pathlib import Path

spec = importlib.util.spec_from_file_location("calculator", Path(__file__).parents[1] / "tools" / "calculator.py")
calculator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calculator)

TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression and return the result.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": 'Numbers combined with + - * / ** and parentheses, e.g. "47 * 38".'}},
        "required": ["expression"]}}}]


def solve(base_url: str, api_key: str, row: dict, max_turns: int = 3, max_tokens: int = 64) -> float:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    messages = [{"role": "system", "content": "Use the calculator, then give the final answer as a number."},
                {"role": "user", "content": row["prompt"]}]
    answer = ""
    for _ in range(max_turns):
        out = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=max_tokens)
        message = out.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = message.content or ""
            break
        for call in message.tool_calls:
            try:
                result = calculator.calculate(**json.loads(call.function.arguments))
            except Exception as e:  # the model's bad call is its answer, as a tool would say it
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(bool(numbers) and float(numbers[-1]) == float(row["answer"]))
