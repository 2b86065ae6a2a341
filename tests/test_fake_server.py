"""The fake API rejects what the real one rejects; otherwise a clean run would prove nothing."""

import anthropic
import pytest

from fake_anthropic import text, tool_use

TOOLS = [{"name": "bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]
CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}]}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}


@pytest.fixture
def client(fake):
    return anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)


def send(client, messages, **extra):
    return client.messages.create(model="m", max_tokens=100, tools=TOOLS, messages=messages, **extra)


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "go"}, CALL],
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1."),
    ([{"role": "user", "content": "go"}, CALL, {"role": "user", "content": [{"type": "text", "text": "hm"}]}],
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1."),
    ([{"role": "user", "content": [RESULT]}],
     "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1."),
    ([{"role": "user", "content": "go"}, CALL, {"role": "user", "content": [{"type": "text", "text": "x"}, RESULT]}],
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1."),
    ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "messages: text content blocks must be non-empty"),
    ([{"role": "assistant", "content": "hi"}], 'messages: first message must use the "user" role'),
    ([{"role": "user", "content": "go"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "bash", "input": {}},
        {"type": "tool_use", "id": "a", "name": "bash", "input": {}}]}],
     "messages.1.content.1: `tool_use` ids must be unique"),
])
def test_invalid_histories_get_the_real_error_text(client, fake, messages, message):
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, messages)
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["message"].startswith(message)


def test_a_paired_history_is_accepted(client, fake):
    fake.reply(text("fine"))
    reply = send(client, [{"role": "user", "content": "go"}, CALL, {"role": "user", "content": [RESULT]}])
    assert reply.content[0].text == "fine" and fake.rejections == []


def test_the_window_is_enforced_with_the_real_message(client, fake):
    fake.context_window = 50
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, [{"role": "user", "content": "word " * 200}])
    assert caught.value.body["error"]["message"].startswith("prompt is too long: ")
    assert caught.value.body["error"]["message"].endswith(" tokens > 50 maximum")


def test_streaming_and_count_tokens_speak_the_wire_format(client, fake):
    fake.reply(tool_use("bash", {"command": "ls"}, "toolu_s", preface="Looking."))
    with client.messages.stream(model="m", max_tokens=100, tools=TOOLS,
                                messages=[{"role": "user", "content": "go"}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "Looking." and final.stop_reason == "tool_use"
    assert final.content[1].input == {"command": "ls"} and final.usage.input_tokens > 0
    counted = client.messages.count_tokens(model="m", tools=TOOLS, messages=[{"role": "user", "content": "go"}])
    assert counted.input_tokens == final.usage.input_tokens


def test_cjk_text_costs_a_token_per_character(client, fake):
    ascii_count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "a" * 700}])
    cjk_count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "压" * 700}])
    assert cjk_count.input_tokens - ascii_count.input_tokens == 700 - 200
