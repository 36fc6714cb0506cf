"""Drives a running burn-llm server with the official `openai` Python client.

Usage: python openai_client_check.py BASE_URL MODEL API_KEY
(BASE_URL like http://127.0.0.1:8000/v1). Runs a completion, a chat completion, both streamed,
a structured output, a tool-call round trip (required call, streamed call, the tool's result sent
back) and error cases; prints one JSON line of what it saw and exits non-zero on any mismatch.
"""

import json
import sys

import openai


def main() -> int:
    base_url, model, api_key = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    seen = {}

    completion = client.completions.create(model=model, prompt="Hello, my name is", max_tokens=8, temperature=0)
    assert completion.object == "text_completion", completion
    assert completion.choices[0].finish_reason in ("stop", "length"), completion
    assert completion.usage.completion_tokens >= 1, completion.usage
    seen["completion"] = completion.choices[0].text

    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(
            model=model, prompt="Hello, my name is", max_tokens=8, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert streamed == seen["completion"], (streamed, seen["completion"])

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi there"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.role == "assistant", chat
    seen["chat"] = chat.choices[0].message.content

    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi there"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    assert "".join(pieces) == seen["chat"], (pieces, seen["chat"])
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    structured = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Plan a trip"}],
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": schema, "strict": True}},
        max_tokens=60,
        seed=1,
    )
    trip = json.loads(structured.choices[0].message.content)
    assert trip["city"] in ("Paris", "Rome") and 1 <= trip["days"] <= 7, trip
    seen["structured"] = trip

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": schema}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice="required", max_tokens=70, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_"), call
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] in ("Paris", "Rome"), arguments
    streamed_calls, reason = {}, None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice="required", max_tokens=70, temperature=0, stream=True
    ):
        for c in chunk.choices:
            for delta in c.delta.tool_calls or []:
                entry = streamed_calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
            reason = c.finish_reason or reason
    assert reason == "tool_calls", reason
    assert streamed_calls[0] == {"name": "get_weather", "arguments": call.function.arguments}, streamed_calls
    messages.append(choice.message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 21})})
    final = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=8, temperature=0)
    assert final.choices[0].message.role == "assistant", final
    seen["tool_call"] = {"name": call.function.name, "arguments": arguments}

    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], max_tokens=4, extra_body={"frobnicate": 1}
        )
        raise AssertionError("an unknown field was accepted")
    except openai.BadRequestError as e:
        assert "frobnicate" in str(e), e
    try:
        client.completions.create(model=model, prompt="x", max_tokens=8, temperature=-1)
        raise AssertionError("temperature -1 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "temperature" in str(e), e
        seen["error"] = e.body
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        seen["not_found"] = e.status_code
    bad_key = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
    try:
        bad_key.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as e:
        seen["auth"] = e.status_code
    seen["models"] = [m.id for m in client.models.list().data]
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
