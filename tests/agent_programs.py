"""Agent programs for tests/agents/test_endpoint.py: black boxes that talk to the policy with the real `openai`
client, own their tool loop, and report a reward (named by path, as a recipe names them)."""

import json

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def tool_loop(base_url, api_key, row, max_turns=3, max_tokens=12):
    """Asks the row's question with a tool; runs every call the model writes, says "Go on." after a turn without
    one; the reward is the number of digits the model wrote, over its turns."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": row["prompt"]}]
    digits = 0
    for _ in range(max_turns):
        out = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=max_tokens)
        message = out.choices[0].message
        digits += sum(ch.isdigit() for ch in message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        else:
            messages.append({"role": "user", "content": "Go on."})
    return float(digits)


async def async_two_turns(base_url, api_key, row):
    """The async client, two turns, no reward (the recipe's reward functions score the episode)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        out = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        messages += [out.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
    return None


def rewrites_history(base_url, api_key, row):
    """Its second request drops the first answer: served, not recorded."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=30)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hello"}], max_tokens=6)
    return 1.0 if first.choices[0].message.content is not None else 0.0


def hangs(base_url, api_key, row):
    import time

    from openai import OpenAI

    OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    time.sleep(120)


def raises(base_url, api_key, row):
    raise RuntimeError("the agent broke")


def not_a_program(x):
    return x
