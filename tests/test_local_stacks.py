"""A local model behind a proxy: llama.cpp's server (llama-cpp-python) behind LiteLLM's
Anthropic-compatible /v1/messages. The fake speaks what that stack was seen to send: an
overflow or any failure inside the server as a 200 with no content and no usage, a tool
call as many tool_use blocks that share its id, a 500 for a system prompt that is not a
string, 400 "No connected db." for a wrong key. The program must never fail in silence."""

import json

import anthropic
import pytest

from conftest import assert_requests_valid, blocks, chat, run_cli, user
from s08_context_compact.offline.fake_anthropic import PROVIDERS, FakeAnthropic, error, silent_failure, text, tool_use
from s08_context_compact.endpoint import model_calls as endpoint_module
from s08_context_compact.endpoint import replies
from s08_context_compact.command_line import handle_command
from s08_context_compact.messages import estimate_tokens

LITELLM_LLAMACPP = PROVIDERS["litellm_llamacpp"]


def stack(**overrides) -> FakeAnthropic:
    return FakeAnthropic(**{**LITELLM_LLAMACPP, **overrides})


def transcript_footers(workspace) -> list:
    return [json.loads(path.read_text().splitlines()[-1]) for path in sorted((workspace / ".transcripts").glob("compact-*"))]


# ---------------------------------------------------------------- an empty success is not an answer

def test_an_empty_success_is_read_as_a_failure_not_an_answer():
    events = [("message_start", {"message": {"usage": {"input_tokens": 0, "output_tokens": 0}}}),
              ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
              ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 0, "output_tokens": 0}})]
    with pytest.raises(replies.EmptyReply):
        replies.reply_from_events(events, None)
    # blanks with usage are a reply of nothing said: a placeholder keeps the history valid,
    # but it is the program's own words, not the model's
    events[-1] = ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 9, "output_tokens": 1}})
    content, _, _ = replies.reply_from_events(events, None)
    assert [b["text"] for b in content] == ["(no reply)"] and replies.OWN in content[0]


def test_a_silent_failure_is_retried_then_said_in_one_line_and_nothing_is_stored(s08, make_agent):
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(*[silent_failure()] * 4)
        messages = []
        assert s08.take_turn(agent, messages, "hello") is False
        # a call and one retry, each as the request is, then as plain text: a third try would not differ
        assert len(fake.requests) == 4 and fake.template_failures == 2 and len(fake.main_requests) == 2
        said = agent.out.text
        retries = [line for line in said.splitlines() if line.startswith("[api]")]
        assert len(retries) == 1 and "answered with nothing" in retries[0] and "(retry 1 of 1)" in retries[0]
        failed = [line for line in said.splitlines() if line.startswith("API error:")]
        assert len(failed) == 1 and "no content, no usage" in failed[0] and "CONTEXT_WINDOW" in failed[0]
        assert ".." not in failed[0]
        assert messages == [], "no (no reply) kept as the model's answer; the prompt is taken back out"


def test_after_one_silent_failure_the_retry_is_the_answer(s08, make_agent):
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(silent_failure(), text("Hello there."))
        messages = []
        assert s08.take_turn(agent, messages, "hello")
        assert [b["text"] for b in blocks(messages[-1])] == ["Hello there."]


def test_an_overflow_as_an_empty_success_teaches_a_window_and_compacts(s08, make_agent, workspace):
    """llama.cpp's n_ctx is 6,000 here; the program assumes 200,000 until the empty reply."""
    with stack(context_window=6_000) as fake:
        agent = make_agent(server=fake)
        messages = chat(2, 3_000)  # answered once: about 2,000 tokens
        messages.append(user("one more question"))
        fake.reply(text("First answer."))
        s08.agent_loop(agent, messages)
        messages += chat(3, 4_000)[2:] + [user("and the last one")]  # now well over 6,000
        fake.reply(text("Last answer."))
        assert s08.agent_loop(agent, messages) == "Last answer."
        said = agent.out.text
        assert "[window] the endpoint answered about" in said and "CONTEXT_WINDOW" in said
        assert agent.endpoint.window < 6_000 and agent.endpoint.learned
        assert fake.overflows, "the server did refuse it"
        assert "[reactive_compact]" in said
        assert "(no reply)" not in json.dumps(messages)
        assert fake.invalid == [] and len(fake.rejections) == len(fake.overflows), "only refused for its size"


def test_a_small_request_that_gets_an_empty_reply_is_not_taken_for_an_overflow(s08, make_agent):
    """Below what the program can work in, or no larger than a request already answered,
    an empty reply is a failure of the server, not a sign of a small window."""
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(text("First."), *[silent_failure()] * 4)
        messages = []
        s08.take_turn(agent, messages, "hello")
        s08.take_turn(agent, messages, "again")
        assert agent.endpoint.window == 200_000 and not agent.endpoint.learned
        assert "[window]" not in agent.out.text


def test_an_empty_or_placeholder_summary_is_a_failed_summary(s08, make_agent, workspace):
    with stack() as fake:
        agent = make_agent(server=fake)
        messages = chat(3, 500) + [user("what now")]
        fake.summary(*[silent_failure()] * 4)
        handle_command(agent, messages, "/compact", s08.LESSON)
        assert "[summary] failed (1/3)" in agent.out.text and "summary by the model" not in agent.out.text
        assert transcript_footers(workspace)[-1]["summary_by"] == "fallback"
    with FakeAnthropic() as fake:  # blanks with usage: "(no reply)" is no summary either
        agent = make_agent(server=fake)
        fake.summary(text("  "), text("\n"))
        handle_command(agent, messages, "/compact", s08.LESSON)
        assert transcript_footers(workspace)[-1]["summary_by"] == "fallback"
        assert "(no reply)" not in transcript_footers(workspace)[-1]["summary"]


# ---------------------------------------------------------------- a tool call in pieces

def test_a_tool_call_streamed_in_pieces_runs_once(s08, make_agent, workspace):
    (workspace / "data.txt").write_text("the answer is 42\n")
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(tool_use("read_file", {"path": "data.txt"}), text("It says 42."))
        messages = []
        assert s08.take_turn(agent, messages, "read data.txt")
        calls = [b for m in messages for b in blocks(m) if b.get("type") == "tool_use"]
        assert calls == [{"type": "tool_use", "id": calls[0]["id"], "name": "read_file", "input": {"path": "data.txt"}}]
        results = [b for b in blocks(fake.main_requests[1]["messages"][-1]) if b.get("type") == "tool_result"]
        assert len(results) == 1 and "the answer is 42" in json.dumps(results) and not results[0].get("is_error")
        assert agent.out.text.count("● read_file") == 1 and "✗" not in agent.out.text
        assert_requests_valid(fake)


# ---------------------------------------------------------------- a chat template that takes only strings

def test_a_template_that_takes_only_strings_is_sent_plain_text_once_it_fails(s08, make_agent, workspace):
    """SmolLM2's template behind LiteLLM concatenates strings: text sent as a list of blocks
    fails inside the server. A plain-text try answers it at once; after two such requests
    plain text is kept (one passing failure is no proof)."""
    (workspace / "data.txt").write_text("the answer is 42\n")
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(text("Hi."), text("Hi again."), tool_use("read_file", {"path": "data.txt"}), text("It says 42."))
        messages = []
        assert s08.take_turn(agent, messages, "hello")
        assert fake.template_failures == 1 and not agent.endpoint.plain_text and "[endpoint]" not in agent.out.text
        assert s08.take_turn(agent, messages, "hello again")
        assert fake.template_failures == 2 and agent.out.text.count("[endpoint]") == 1
        assert agent.endpoint.plain_text and agent.endpoint.facts()["plain_text"] is True
        assert s08.take_turn(agent, messages, "read data.txt")
        assert fake.template_failures == 2, "plain text from then on, the tool loop included"
        assert [b["text"] for b in blocks(messages[-1])] == ["It says 42."]
        last = fake.main_requests[-1]
        assert "cache_control" not in json.dumps(last) and isinstance(last["messages"][0]["content"], str)
        assert "[api]" not in agent.out.text


def test_plain_text_keeps_every_word_and_every_pair(s08):
    request = {"model": "m", "max_tokens": 10, "system": "s", "tools": [{"name": "bash", "cache_control": {}}],
               "messages": [
                   {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second",
                                                                                   "cache_control": {}}]},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                                                {"type": "text", "text": "[note: cut short]"}]}]}
    plain = endpoint_module.plain_text_request(request)
    assert plain["messages"][0]["content"] == "first\n\nsecond"
    assert plain["messages"][1]["content"][0] == {"type": "text", "text": "(calling bash)"}
    assert plain["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "t1",
                                                "content": "ok\n\n[note: cut short]"}]
    assert "cache_control" not in json.dumps(plain) and "cache_control" in json.dumps(request), "a copy"
    assert endpoint_module.plain_text_request(plain) == plain


def test_anthropic_is_never_sent_plain_text(s08, make_agent, fake):
    fake.reply(text("Hi."))
    agent = make_agent()
    assert s08.take_turn(agent, [], "hello")
    assert not agent.endpoint.plain_text and "cache_control" in json.dumps(fake.main_requests[0]["messages"])


def test_plain_text_is_remembered_across_resume(workspace):
    with stack() as fake:
        fake.reply(text("Hi."), text("Hi again."), text("Again."))
        first = run_cli(fake, workspace, "hello\nhello again\n")
        assert first.returncode == 0 and fake.template_failures == 2, first.stdout + first.stderr
        second = run_cli(fake, workspace, "again\n", args=("--resume",))
        assert second.returncode == 0 and "Again." in second.stdout, second.stdout + second.stderr
        assert fake.template_failures == 2, "the resumed session sends plain text from its first request"


# ---------------------------------------------------------------- what the proxy refuses

def test_a_server_that_takes_only_a_string_system_prompt_works(s08, make_agent):
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(text("Fine."))
        assert s08.take_turn(agent, [], "hello")
        assert fake.rejections == [] and isinstance(fake.main_requests[0]["system"], str)
        # and the fake does refuse a list, as LiteLLM relaying llama-cpp-python does
        client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as refused:
            client.messages.create(model="m", max_tokens=10, system=[{"type": "text", "text": "Be brief."}],
                                   messages=[user("hi")])
        assert refused.value.body["error"]["message"].count("Be brief.") == 5


def test_each_retry_is_one_line_however_long_the_error(s08, make_agent):
    with stack() as fake:
        agent = make_agent(server=fake)
        pydantic = "litellm.InternalServerError: 10 validation errors:\n" + "\n".join(
            f"  {{'type': 'string_type', 'loc': ('body', 'messages', 0), 'input': '{'You are a coding agent. ' * 20}'}}"
            for _ in range(10))
        fake.reply(error(500, "api_error", pydantic), error(500, "api_error", pydantic), text("Recovered."))
        assert s08.take_turn(agent, [], "hello")
        retries = [line for line in agent.out.text.splitlines() if line.startswith("[api]")]
        assert len(retries) == 2 and all(len(line) < 420 for line in retries)
        assert all("retrying in" in line for line in retries), "the whole line, error and what happens next"


def test_a_wrong_key_through_litellm_is_said_at_start_and_when_the_turn_fails(workspace):
    with stack() as fake:
        done = run_cli(fake, workspace, "hello\n", ANTHROPIC_API_KEY="sk-wrong")
    out = done.stdout + done.stderr
    assert "No connected db." in out and out.count("Check ANTHROPIC_API_KEY") >= 2, out
    failed = [line for line in done.stdout.splitlines() if line.startswith("API error:")]
    assert failed and ".." not in failed[0] and "send it again" not in failed[0].split("once that is fixed")[0]


def test_a_404_from_a_proxy_does_not_ask_to_send_it_again(s08, make_agent):
    with FakeAnthropic() as fake:
        agent = make_agent(server=fake)
        fake.reply(error(404, "not_found_error", '{"detail":"Not Found"}'))
        s08.take_turn(agent, [], "hello")
        failed = [line for line in agent.out.text.splitlines() if line.startswith("API error:")][0]
        assert "Check MODEL_ID and ANTHROPIC_BASE_URL" in failed and "restart" in failed
        assert "send it again (" not in failed and "send it again." not in failed.split("restart")[0]


# ---------------------------------------------------------------- what an empty reply is not

def test_one_passing_empty_reply_to_a_large_request_teaches_nothing(s08, make_agent):
    """An empty reply that a retry answers was a passing failure: no window is learned, no
    compaction runs, and plain text is not kept."""
    with FakeAnthropic() as fake:  # a server that takes blocks, and whose window is ample
        agent = make_agent(server=fake)
        messages = chat(3, 6_000) + [user("go on")]
        fake.reply(text("First."), silent_failure(), text("Second."))
        assert s08.agent_loop(agent, messages) == "First."
        messages.append(user("and more, which is larger than any request answered"))
        assert s08.agent_loop(agent, messages) == "Second."
        assert agent.endpoint.window == 200_000 and not agent.endpoint.learned and not agent.endpoint.plain_text
        assert "[window]" not in agent.out.text and "[reactive_compact]" not in agent.out.text


def test_an_empty_reply_is_no_overflow_when_no_larger_than_one_answered_or_the_window_is_known(s08, make_agent):
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(text("Answered."), *[silent_failure()] * 8)
        s08.agent_loop(agent, chat(3, 6_000) + [user("go on")])
        smaller = chat(2, 6_000) + [user("a smaller one")]
        assert estimate_tokens(smaller) + agent.overhead >= 4_000
        with pytest.raises(replies.EmptyReply):  # no larger than the one answered: a failure, said as one
            s08.agent_loop(agent, smaller)
        assert agent.endpoint.window == 200_000
    with stack() as fake:
        agent = make_agent(server=fake)
        agent.endpoint.window_source = "CONTEXT_WINDOW"  # the user said how big it is
        fake.reply(*[silent_failure()] * 8)
        with pytest.raises(replies.EmptyReply):
            s08.agent_loop(agent, chat(3, 6_000) + [user("go on")])
        assert agent.endpoint.window == 200_000 and not agent.endpoint.learned


def test_a_first_prompt_to_a_template_that_takes_only_strings_is_no_overflow(s08, make_agent):
    with stack() as fake:
        agent = make_agent(server=fake)
        fake.reply(text("Read all of it."))
        assert s08.agent_loop(agent, [user("please read: " + "word " * 20_000)]) == "Read all of it."
        assert agent.endpoint.window == 200_000 and "[window]" not in agent.out.text


@pytest.mark.parametrize("calls, expected", [
    ([("compact", "", "t1"), ("compact", "", "t1")], [("compact", {}), ("compact", {})]),
    ([("bash", '{"command": "ls"}', "t1"), ("compact", "", "t1")], [("bash", {"command": "ls"}), ("compact", {})]),
    ([("compact", "", "t1"), ("bash", '{"command": "ls"}', "t1")], [("compact", {}), ("bash", {"command": "ls"})]),
    ([("read_file", '{"path": "a', "t1"), ("read_file", '{"path": "b.txt"}', "t2")],
     [("read_file", '{"path": "a'), ("read_file", {"path": "b.txt"})]),
    ([("read_file", '{"pa', "t1"), ("read_file", 'th": "b.txt"}', "t1"), ("read_file", "", "t1")],
     [("read_file", {"path": "b.txt"})]),
])
def test_pieces_join_into_one_call_and_whole_calls_stay_apart(calls, expected):
    blocks = {k: {"type": "tool_use", "id": call_id, "name": name, "input": {}, "partial_json": piece}
              for k, (name, piece, call_id) in enumerate(calls)}
    blocks[len(calls)] = {"type": "text", "text": ""}
    got = replies.finished_blocks(blocks)
    assert [(b["name"], b["input"]) for b in got] == expected


def test_plain_text_keeps_thinking_first_and_a_results_images(s08):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    request = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "tool_use", "id": "t1", "name": "read_file", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]},
                                     {"type": "text", "text": "a note"}]}]}
    plain = endpoint_module.plain_text_request(request)["messages"]
    assert [b["type"] for b in plain[1]["content"]] == ["thinking", "text", "tool_use"]
    assert plain[2]["content"][0]["content"] == [image, {"type": "text", "text": "a note"}]
