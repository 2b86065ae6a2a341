"""The fake API rejects what the real one rejects; otherwise a clean run would prove nothing."""

import ast
import http.client
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import anthropic
import pytest

import s08_context_compact.offline.fake_anthropic as fake_package

from s08_context_compact.offline.fake_anthropic import (OVERFLOWS, FakeAnthropic, broken_tool_json, count_tokens, error_event, hang, malformed,
                            pings_only, sign_thinking, text, tool_use, tool_uses)

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


def test_the_timeline_holds_each_request_its_kind_and_when_it_came_and_was_answered(client, fake):
    fake.context_window = 200
    send(client, [{"role": "user", "content": "go"}])
    client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "go"}])
    with pytest.raises(anthropic.BadRequestError):
        send(client, [{"role": "user", "content": "word " * 400}])
    client.messages.create(model="m", max_tokens=100, tools=[], tool_choice={"type": "none"},
                           messages=[{"role": "user", "content": "summarize"}])
    assert [kind for kind, _, _ in fake.timeline] == ["main", "count", "refused", "summary"]
    times = [t for _, arrived, answered in fake.timeline for t in (arrived, answered)]
    assert times == sorted(times), "one after another, each answered before the next came"


def test_cjk_text_costs_a_token_per_character(client, fake):
    ascii_count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "a" * 700}])
    cjk_count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "压" * 700}])
    assert cjk_count.input_tokens - ascii_count.input_tokens == 700 - 200


# ---------------------------------------------------------------- provider behaviours
#
# These talk raw HTTP where the SDK would hide the wire (status lines, exact bodies,
# SSE events), and drive the SDK where what matters is what a client gets to see.

def raw(fake, body=None, path="/v1/messages", method="POST", headers=None, timeout=5.0):
    """Send one request by hand; answer (status, headers, body bytes)."""
    url = urlparse(fake.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    sent = {"x-api-key": "test", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    sent.update(headers or {})
    sent = {k: v for k, v in sent.items() if v is not None}
    try:
        connection.request(method, path, None if body is None else json.dumps(body), sent)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def events(data: bytes) -> list:
    """The SSE events of a body as (name, data text) pairs, in order."""
    found = []
    for chunk in data.decode().split("\n\n"):
        if chunk.strip():
            fields = dict(line.split(": ", 1) for line in chunk.splitlines())
            found.append((fields["event"], fields["data"]))
    return found


def payloads(data: bytes) -> list:
    return [json.loads(d) for _, d in events(data)]


def ask(content="go", max_tokens=100, stream=False, **extra):
    return {"model": "m", "max_tokens": max_tokens, "tools": TOOLS, "stream": stream,
            "messages": [{"role": "user", "content": content}], **extra}


def eventually(condition, timeout=3.0):
    """Poll for something another thread does (the server notices a hang-up on its own time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


# ---- overflow styles

PROMPT = "word " * 200          # about 300 tokens with the tools and framing (N, below)
N = count_tokens(ask(PROMPT))

def test_the_empty_413_has_no_body_at_all(fake):
    fake.overflow, fake.context_window = "413_empty", 100
    status, headers, data = raw(fake, ask(PROMPT))
    assert (status, data, headers["content-length"]) == (413, b"", "0")
    assert fake.overflows == ["413"] and fake.rejections == ["413"]


COUNTS_MAX_TOKENS = {name for name, overflow in OVERFLOWS.items() if overflow.counts_max_tokens}


def test_max_tokens_counts_against_the_window_only_where_the_provider_counts_it(fake):
    fake.context_window = N + 50   # the prompt fits; with max_tokens 100 it does not
    for style in sorted(OVERFLOWS):
        fake.overflow, refused = style, len(fake.overflows)
        fake.reply(text("fits"))
        status, _, data = raw(fake, ask(PROMPT, max_tokens=100))
        answered = status == 200 and json.loads(data)["content"] == [{"type": "text", "text": "fits"}]
        assert answered == (style not in COUNTS_MAX_TOKENS), style
        assert len(fake.overflows) - refused == (style in COUNTS_MAX_TOKENS), style
        fake.replies.clear()


def test_a_stop_reason_overflow_is_a_200_with_no_content_streamed_or_not(fake):
    fake.overflow, fake.context_window = "stop_reason", N + 50
    fake.reply(text("unused"))
    status, _, data = raw(fake, ask(PROMPT, stream=True))
    start, *rest = payloads(data)
    assert status == 200 and [e["type"] for e in rest] == ["ping", "message_delta", "message_stop"]
    assert start["message"]["usage"]["input_tokens"] == N    # it did read the prompt
    assert rest[1]["delta"]["stop_reason"] == "model_context_window_exceeded"
    status, _, data = raw(fake, ask(PROMPT))
    message = json.loads(data)
    assert (status, message["content"], message["stop_reason"]) == (200, [], "model_context_window_exceeded")
    assert message["usage"]["input_tokens"] == N
    assert fake.overflows == ["model_context_window_exceeded"] * 2 and len(fake.replies) == 1  # script untouched


def test_invalid_requests_and_overflows_are_told_apart(fake):
    fake.context_window = 100
    raw(fake, {"model": "m", "max_tokens": 10, "messages": []})
    raw(fake, ask(PROMPT))
    too_long = f"prompt is too long: {N} tokens > 100 maximum"
    assert fake.invalid == ["messages: at least one message is required"] and fake.overflows == [too_long]
    assert fake.rejections == ["messages: at least one message is required", too_long]


def test_styles_are_checked_and_can_change_on_a_running_server(fake):
    with pytest.raises(ValueError):
        fake.overflow = "openia"
    with pytest.raises(ValueError):
        FakeAnthropic(usage="kimi")
    fake.context_window = 100
    assert json.loads(raw(fake, ask(PROMPT))[2])["error"]["message"].startswith("prompt is too long")
    fake.overflow = "minimax"
    assert json.loads(raw(fake, ask(PROMPT))[2])["error"]["message"].startswith("invalid params")


# ---- missing APIs

def test_without_a_models_api_every_lookup_is_a_404(client, fake):
    fake.max_input_tokens = 64_000
    assert client.models.retrieve("m").max_input_tokens == 64_000
    fake.models_api = False
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.models.retrieve("m")
    assert caught.value.body["error"]["type"] == "not_found_error" and fake.model_lookups == ["m", "m"]


def test_without_count_tokens_the_call_is_a_404_and_still_counted(client, fake):
    fake.count_tokens_api = False
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "go"}])
    assert caught.value.body["error"]["type"] == "not_found_error" and fake.count_token_calls == 1


# ---- usage styles

CACHED = [{"type": "text", "text": "rule " * 1000, "cache_control": {"type": "ephemeral"}}]


def usage_events(fake, style):
    """Stream the same cached prompt twice; the second reply's (message_start usage, message_delta)."""
    fake.usage = style
    raw(fake, ask(stream=True, system=CACHED))
    start, *_, delta, _ = payloads(raw(fake, ask(stream=True, system=CACHED))[2])
    return start["message"]["usage"], delta


def test_anthropic_usage_comes_in_message_start_and_output_in_message_delta(fake):
    start, delta = usage_events(fake, "anthropic")
    truth = fake.usage_log[-1]
    assert truth["cache_read_input_tokens"] > 0
    assert start["input_tokens"] == truth["input_tokens"]
    assert start["cache_read_input_tokens"] == truth["cache_read_input_tokens"]
    assert delta["usage"] == {"output_tokens": truth["output_tokens"]}


def test_minimax_sends_message_delta_without_usage(fake):
    start, delta = usage_events(fake, "no_delta_usage")
    assert "usage" not in delta and start["input_tokens"] == fake.usage_log[-1]["input_tokens"]


def test_glm_reports_zeros_first_and_the_real_figures_at_the_end(fake):
    start, delta = usage_events(fake, "zero_start")
    truth = fake.usage_log[-1]
    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
    assert [start[k] for k in keys] == [0, 0, 0, 0]
    assert delta["usage"] == {k: truth[k] for k in keys} and truth["input_tokens"] > 0


def test_kimi_input_tokens_already_include_the_cache_reads(fake):
    start, _ = usage_events(fake, "includes_cache")
    truth = fake.usage_log[-1]
    assert start["input_tokens"] == truth["input_tokens"] + truth["cache_read_input_tokens"]
    assert start["cache_read_input_tokens"] == truth["cache_read_input_tokens"] > 0
    usage = json.loads(raw(fake, ask(system=CACHED))[2])["usage"]
    assert usage["input_tokens"] == fake.usage_log[-1]["input_tokens"] + fake.usage_log[-1]["cache_read_input_tokens"]


def test_usage_none_reports_no_usage_anywhere(fake):
    start, delta = usage_events(fake, "none")
    assert start is None and "usage" not in delta
    assert json.loads(raw(fake, ask())[2])["usage"] is None
    assert fake.usage_log[-1]["input_tokens"] > 0    # what it really cost is still known


# ---- auth

def test_bearer_auth_refuses_an_x_api_key_and_a_wrong_token(fake):
    fake.auth, fake.token = "bearer", "secret"
    status, _, data = raw(fake, ask(), headers={"x-api-key": "secret"})
    assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    assert "Missing bearer token" in json.loads(data)["error"]["message"]
    status, _, data = raw(fake, ask(), headers={"x-api-key": None, "authorization": "Bearer wrong"})
    assert (status, json.loads(data)["error"]["message"]) == (401, "Invalid bearer token")
    status, _, _ = raw(fake, ask(), headers={"x-api-key": None, "authorization": "Bearer secret"})
    assert status == 200
    assert fake.auth_headers == [{"x-api-key": "secret", "authorization": None},
                                 {"x-api-key": None, "authorization": "Bearer wrong"},
                                 {"x-api-key": None, "authorization": "Bearer secret"}]


# ---- thinking

def thinking_turn(client):
    """One streamed tool-calling turn with thinking on; answer the history to send back."""
    with client.messages.stream(model="m", max_tokens=100, tools=TOOLS,
                                messages=[{"role": "user", "content": "go"}]) as stream:
        reply = stream.get_final_message()
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[1].id, "content": "ok"}]}]


def test_thinking_streams_a_signed_block_first(fake):
    fake.thinking = True
    fake.reply(tool_use("bash", {}, "toolu_t"))
    found = payloads(raw(fake, ask(stream=True))[2])
    start = next(e for e in found if e["type"] == "content_block_start")
    deltas = [e["delta"] for e in found if e["type"] == "content_block_delta" and e["index"] == 0]
    assert start["content_block"]["type"] == "thinking" and start["index"] == 0
    thought = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    assert thought and deltas[-1] == {"type": "signature_delta", "signature": sign_thinking(thought)}
    message = json.loads(raw(fake, ask())[2])
    assert message["content"][0]["type"] == "thinking" and message["content"][0]["signature"]


def test_thinking_passed_back_unchanged_is_accepted(client, fake):
    fake.thinking = True
    fake.reply(tool_use("bash", {}), text("fine"))
    assert send(client, thinking_turn(client)).content[-1].text == "fine" and fake.invalid == []


def test_thinking_left_out_of_a_tool_loop_is_refused(client, fake):
    fake.thinking = True
    fake.reply(tool_use("bash", {}))
    history = thinking_turn(client)
    history[1]["content"] = history[1]["content"][1:]
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, history)
    assert caught.value.body["error"]["message"] == (
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When "
        "`thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
        "lastmost set of `tool_use` and `tool_result` blocks).")


@pytest.mark.parametrize("field", ["thinking", "signature"])
def test_thinking_altered_on_the_way_back_is_refused(client, fake, field):
    fake.thinking = True
    fake.reply(tool_use("bash", {}))
    history = thinking_turn(client)
    history[1]["content"][0][field] += "x"
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, history)
    assert caught.value.body["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"


def test_redacted_thinking_arrives_whole_and_may_be_passed_back(client, fake):
    fake.thinking = True
    fake.reply({"content": [{"type": "redacted_thinking", "data": "opaque"},
                            {"type": "tool_use", "id": "toolu_r", "name": "bash", "input": {}}]}, text("fine"))
    found = payloads(raw(fake, ask(stream=True))[2])
    assert [e["content_block"] for e in found if e["type"] == "content_block_start"][0] == \
        {"type": "redacted_thinking", "data": "opaque"}
    assert not [e for e in found if e["type"] == "content_block_delta" and e["index"] == 0]
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "opaque"},
                                                 {"type": "tool_use", "id": "toolu_r", "name": "bash", "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r", "content": "ok"}]}]
    assert send(client, history).content[-1].text == "fine"


# ---- tool ids

def test_kimi_tool_ids_are_numbered_within_each_reply(client, fake):
    fake.tool_ids = "kimi"
    fake.reply(tool_uses([("bash", {}), ("read_file", {})]), tool_use("bash", {}))
    first = [b.id for b in send(client, [{"role": "user", "content": "go"}]).content]
    second = [b.id for b in send(client, [{"role": "user", "content": "go"}]).content]
    assert first == ["functions.bash:0", "functions.read_file:1"] and second == ["functions.bash:0"]


def test_a_history_repeating_a_kimi_id_is_still_refused_as_today(client, fake):
    call = {"role": "assistant",
            "content": [{"type": "tool_use", "id": "functions.bash:0", "name": "bash", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "functions.bash:0", "content": "ok"}]}
    fake.tool_ids = "kimi"
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, [{"role": "user", "content": "go"}, call, result, call, result])
    assert caught.value.body["error"]["message"] == "messages.3.content.0: `tool_use` ids must be unique"


# ---- malformed replies on the wire

def test_sse_not_json_breaks_the_second_event_then_closes(fake):
    fake.reply(malformed("sse_not_json"))
    status, headers, data = raw(fake, ask(stream=True))
    (first, first_data), (second, second_data) = events(data)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert first == "message_start" and json.loads(first_data)["type"] == "message_start"
    assert second_data == "{not json" and fake.valid_requests == [fake.requests[0]]


def test_json_body_answers_a_stream_request_with_a_json_message(fake):
    fake.reply(malformed("json_body", reply=text("hi")))
    status, headers, data = raw(fake, ask(stream=True))
    message = json.loads(data)
    assert status == 200 and headers["content-type"] == "application/json"
    assert message["type"] == "message" and message["content"] == [{"type": "text", "text": "hi"}]


def test_empty_body_is_a_200_with_nothing_in_it(fake):
    fake.reply(malformed("empty_body"))
    status, headers, data = raw(fake, ask(stream=True))
    assert (status, headers["content-type"], headers["content-length"], data) == (200, "text/event-stream", "0", b"")


def test_an_error_event_arrives_inside_a_200_stream(fake):
    fake.reply(error_event(), error_event("invalid_request_error", "context_length_exceeded"))
    status, _, data = raw(fake, ask(stream=True))
    assert status == 200 and [name for name, _ in events(data)] == ["message_start", "error"]
    assert json.loads(events(data)[1][1]) == {"type": "error", "error": {"type": "overloaded_error",
                                                                         "message": "Overloaded"}}
    assert json.loads(events(raw(fake, ask(stream=True))[2])[1][1])["error"]["message"] == "context_length_exceeded"


def test_broken_tool_json_streams_pieces_that_do_not_parse(fake):
    fake.reply(broken_tool_json("read_file"))
    found = payloads(raw(fake, ask(stream=True))[2])
    pieces = "".join(e["delta"]["partial_json"] for e in found if e["type"] == "content_block_delta")
    assert pieces == '{"path": "a.py", '
    with pytest.raises(ValueError):
        json.loads(pieces)
    assert [e["delta"]["stop_reason"] for e in found if e["type"] == "message_delta"] == ["tool_use"]


@pytest.mark.parametrize("value", ["just a string", ["ls"]])
def test_tool_input_that_is_not_an_object_is_streamed_as_its_json(fake, value):
    fake.reply(tool_use("read_file", value))
    found = payloads(raw(fake, ask(stream=True))[2])
    pieces = "".join(e["delta"]["partial_json"] for e in found if e["type"] == "content_block_delta")
    assert json.loads(pieces) == value


# ---- stalls

def test_a_hang_ends_when_the_client_gives_up(fake):
    fake.reply(hang())
    client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0, timeout=0.2)
    started = time.monotonic()
    with pytest.raises(anthropic.APITimeoutError):
        send(client, [{"role": "user", "content": "go"}])
    assert time.monotonic() - started < 2
    eventually(lambda: fake.stalls == ["client closed"])
    assert fake.valid_requests == fake.requests and len(fake.requests) == 1


def test_a_timed_hang_closes_without_a_response(client, fake):
    fake.reply(hang(0.1))
    with pytest.raises(anthropic.APIConnectionError):
        send(client, [{"role": "user", "content": "go"}])
    assert fake.stalls == ["timed out"]


def test_an_endless_hang_does_not_hold_up_the_server_exit():
    with FakeAnthropic() as fake:
        fake.reply(hang())
        threading.Thread(target=_swallow, args=(raw, fake, ask()), daemon=True).start()
        assert fake.received.wait(3)
        started = time.monotonic()
    assert time.monotonic() - started < 1
    eventually(lambda: fake.stalls == ["server closed"])


def _swallow(call, *args):
    try:
        call(*args)
    except (OSError, http.client.HTTPException):
        pass  # the server went away, which is the point


def test_pings_only_sends_pings_until_the_client_hangs_up(fake):
    fake.reply(pings_only(30))
    url = urlparse(fake.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=3)
    connection.request("POST", "/v1/messages", json.dumps(ask(stream=True)),
                       {"x-api-key": "test", "anthropic-version": "2023-06-01", "content-type": "application/json"})
    response = connection.getresponse()
    seen = []
    while seen.count("event: ping") < 2:
        seen.append(response.fp.readline().decode().strip())
    response.close()      # the response holds the socket open until it is closed too
    connection.close()
    assert response.status == 200 and [line for line in seen if line.startswith("event:")] == [
        "event: message_start", "event: ping", "event: ping"]
    eventually(lambda: fake.stalls == ["client closed"])


# With offline/ first on sys.path and not the project: the fake as readers use it, a library of its own.
ON_ITS_OWN = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import anthropic
    import fake_anthropic
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]
    with fake_anthropic.FakeAnthropic() as fake:
        fake.reply(fake_anthropic.text("hello from the fake"))
        client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
        reply = client.messages.create(model="m", max_tokens=100, tools=tools,
                                       messages=[{"role": "user", "content": "hi"}])
    print(json.dumps({"names": sorted(dir(fake_anthropic)), "file": fake_anthropic.__file__,
                      "reply": reply.content[0].text, "requests": len(fake.valid_requests),
                      "project": sorted(m for m in sys.modules if m.startswith("s08_context_compact"))}))
""")


def test_the_fake_imports_on_its_own_from_the_offline_folder(tmp_path):
    """The package's files import one another only relatively, so `import fake_anthropic` with offline/
    on sys.path gives the very names of the package path, and that fake answers the real SDK."""
    folder = Path(fake_package.__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_") and "proxy" not in k.lower()}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", ON_ITS_OWN, str(folder.parent)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert Path(seen["file"]).resolve() == folder / "__init__.py" and seen["project"] == []
    assert set(seen["names"]) == set(dir(fake_package))
    assert seen["reply"] == "hello from the fake" and seen["requests"] == 1


def test_the_package_exports_every_name_its_files_define():
    """Every top-level function, class and constant of the package's files, private ones too, is
    importable from the package, as it was from the single fake_anthropic.py."""
    defined = set()
    for path in Path(fake_package.__file__).parent.glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {target.id for target in targets if isinstance(target, ast.Name)}
    defined.discard("__all__")
    assert defined == set(fake_package.__all__)
    assert all(hasattr(fake_package, name) for name in fake_package.__all__)
    assert "FakeAnthropic" in defined and "_Handler" in defined and len(defined) == 64
