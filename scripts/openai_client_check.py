"""Drives a running burn-llm server with the official `openai` Python client.

Usage: python openai_client_check.py BASE_URL MODEL API_KEY
(BASE_URL like http://127.0.0.1:8000/v1). Runs a completion, a chat completion, both streamed,
and an error case; prints one JSON line of what it saw and exits non-zero on any mismatch.
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
