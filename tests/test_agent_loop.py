"""agent_loop driven in-process with the real SDK against the fake Messages API."""

import json
import re

import pytest

from conftest import assert_requests_valid, assert_valid, blocks, plain, user
from conftest import chat as chat_history
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, is_summary_request, server_error, text, tool_use, tool_uses
from s08_context_compact.endpoint import model_calls as endpoint  # noqa: E402
from s08_context_compact.messages import estimate_tokens
from s08_context_compact.command_line import HOOK_EVENTS, handle_command


def first_text(body, index=0):
    return blocks(body["messages"][index])[0].get("text", "")


def instruction(body):
    """The summary instruction: the last text of a summary request."""
    return blocks(body["messages"][-1])[-1]["text"]


def rejected_main_requests(fake):
    return [r for r in fake.requests if not r.get("_valid") and not is_summary_request(r)]


def test_every_tool_result_goes_back_in_one_message_in_call_order(s08, fake, make_agent, workspace):
    (workspace / "a.txt").write_text("alpha")
    fake.reply(tool_uses([("read_file", {"path": "a.txt"}, "toolu_1"), ("bash", {"command": "echo two"}, "toolu_2"),
                          ("glob", {"pattern": "*.txt"}, "toolu_3")]), text("Read all three."))
    agent = make_agent()
    messages = [user("look around")]
    final = s08.agent_loop(agent, messages)
    assert final == "Read all three."
    sent = fake.main_requests[1]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in sent] == ["toolu_1", "toolu_2", "toolu_3"]
    assert "alpha" in sent[0]["content"] and sent[1]["content"] == "two" and sent[2]["content"] == "a.txt"
    assert_requests_valid(fake)
    assert_valid(messages, "look around")


def test_history_holds_plain_json_dicts(s08, fake, make_agent):
    fake.reply(tool_use("bash", {"command": "echo hi"}, preface="Checking."), text("Done."))
    messages = [user("go")]
    s08.agent_loop(make_agent(), messages)
    assert json.loads(json.dumps(messages)) == messages
    assert messages[1]["content"][0] == {"type": "text", "text": "Checking."}


def test_empty_text_blocks_from_the_model_are_not_sent_back(s08, fake, make_agent):
    fake.reply({"content": [{"type": "text", "text": ""}, {"type": "tool_use", "id": "toolu_e", "name": "bash",
                                                          "input": {"command": "true"}}]}, text("ok"))
    s08.agent_loop(make_agent(), [user("go")])
    assert fake.rejections == []
    assert fake.main_requests[1]["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_e", "name": "bash", "input": {"command": "true"}}]


def test_a_huge_new_result_reaches_the_model_as_a_preview_with_the_full_text_on_disk(s08, fake, make_agent, workspace):
    big = "".join(f"row {n}\n" for n in range(10_000))  # over the budget, under bash's memory cap
    (workspace / "big.log").write_text(big)
    fake.reply(tool_use("bash", {"command": "cat big.log"}, "toolu_big"), text("Seen it."))
    agent = make_agent(window=30_000)
    s08.agent_loop(agent, [user("show the log")])
    sent = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert sent.startswith("<persisted-output") and "row 0\nrow 1\n" in sent
    saved = workspace / ".task_outputs" / "tool-results" / "toolu_big.txt"
    assert saved.read_text() == big.rstrip("\n")
    assert "[tool_result_budget] 1 large result → disk + preview" in agent.out.text
    assert_requests_valid(fake)


def test_auto_compact_summarizes_when_still_over_the_threshold(s08, fake, make_agent, workspace):
    agent = make_agent(window=20_000)
    messages = chat_history(12, 2_000) + [user("now write the release notes")]
    fake.summary(text("<analysis>thinking</analysis><summary>We discussed twelve questions.</summary>"))
    fake.reply(text("Here are the notes."))
    s08.agent_loop(agent, messages)
    assert len(fake.summary_requests) == 1
    summary_request = fake.summary_requests[0]
    assert "tool_choice" not in summary_request, "the request is the conversation's, so its cache is read"
    said = instruction(summary_request)
    assert said.startswith("TEXT ONLY, NO TOOLS.") and said.rstrip().endswith("Do not call any tools.")
    for section in ("1. Primary request and intent", "3. Files and code sections", "6. All user messages",
                    "8. Current work", "9. Next step", "<analysis>"):
        assert section in said
    # the summary continues the conversation as it was, so its prefix is a cache read
    history = chat_history(12, 2_000) + [user("now write the release notes")]
    sent = plain(summary_request["messages"])
    assert sent[:-1] == history[:-1] and sent[-1]["content"][:-1] == history[-1]["content"]
    sent = fake.main_requests[0]["messages"]
    assert first_text(fake.main_requests[0]).startswith("[Compacted")
    assert "We discussed twelve questions." in first_text(fake.main_requests[0])
    assert "thinking" not in json.dumps(sent)
    assert blocks(sent[0])[-1]["text"] == "now write the release notes"
    transcript = next((workspace / ".transcripts").glob("compact-*.jsonl"))
    *replaced, event = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert replaced == chat_history(12, 2_000) + [user("now write the release notes")]
    assert event["type"] == "compaction" and event["summary"] == "We discussed twelve questions."
    assert event["summary_by"] == "the model" and event["ledger"]["total"] == 0
    assert "[compact_history] 25 messages → summary" in agent.out.text
    assert_requests_valid(fake)


def test_reactive_compact_retries_once_after_prompt_too_long(s08, make_agent, workspace):
    # The server's tokenizer counts four times what the estimate says, so the
    # estimate stays under the threshold while the real count is over the window.
    with FakeAnthropic(context_window=20_000, chars_per_token=1.0) as fake:
        agent = make_agent(window=20_000, server=fake)
        messages = chat_history(10, 1_500) + [user("continue please")]
        fake.reply(text("Continuing."))
        s08.agent_loop(agent, messages)
        assert len(rejected_main_requests(fake)) == 1 and fake.rejections[0].startswith("prompt is too long: ")
        assert len(fake.rejections) <= 2, "the summary call learns the real size from the first error"
        retried = fake.main_requests[0]
        assert first_text(retried).startswith("[Reactive compact")
        assert blocks(retried["messages"][0])[-1]["text"] == "continue please" or \
            retried["messages"][-1]["content"][-1]["text"] == "continue please"
        assert list((workspace / ".transcripts").glob("reactive-*.jsonl"))
        assert "[reactive_compact]" in agent.out.text
        # The API counted about four times the estimate, so the recent tail kept is a quarter
        # of REACTIVE_TAIL_SHARE by estimate: one exchange, where trusting the estimate keeps four.
        kept = [m for m in retried["messages"][1:] if m["role"] == "assistant"]
        share = agent.settings.threshold * s08.REACTIVE_TAIL_SHARE
        assert len(kept) == 1 and estimate_tokens(plain(retried["messages"][1:])) <= share / 3
        assert_valid(messages, "continue please")


def test_reactive_compact_is_tried_once_then_the_error_is_reported(s08, make_agent):
    with FakeAnthropic(context_window=500) as fake:  # smaller than the system prompt alone
        agent = make_agent(window=20_000, server=fake)
        messages = []
        s08.take_turn(agent, messages, "hello")
        assert len(rejected_main_requests(fake)) == 2
        assert "API error: the context window overflowed (prompt is too long: " in agent.out.text
        assert "try /compact" in agent.out.text
        assert_valid(messages, "hello")


def test_repeated_500s_trip_the_breaker_and_the_session_still_finishes(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat_history(12, 2_000)
    fake.summary(*[server_error() for _ in range(30)])
    # every reply is long enough to push the next turn over the threshold again
    fake.reply(*[text(f"answer {n} " + "long " * 11_000) for n in range(6)])
    for n in range(6):
        s08.take_turn(agent, messages, f"turn {n}")
        assert_valid(messages, f"turn {n}")
    attempts = endpoint.MAX_API_ATTEMPTS
    assert len(fake.summary_requests) == 3 * attempts, "each summary is retried, then none after the breaker trips"
    assert agent.out.text.count("summaries failed in a row") == 1
    assert len(fake.main_requests) == 6 and "API error" not in agent.out.text
    assert agent.stats["compact_history"]["runs"] == 6, "compaction goes on with summaries built without the model"
    assert "summary by fallback" in agent.out.text
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "Summaries: 3 failed in a row, so none is asked for this session" in agent.out.text
    assert "Summary ahead:" not in agent.out.text, "no summary ahead is promised while none is asked for"


def test_a_successful_summary_resets_the_failure_count(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat_history(12, 2_000)
    fake.summary(*[server_error() for _ in range(2 * endpoint.MAX_API_ATTEMPTS)])
    fake.default_summary = text("<summary>fine</summary>")  # each summary call after the failures
    fake.reply(*[text("long " * 11_000) for _ in range(3)])
    s08.take_turn(agent, messages, "one")
    s08.take_turn(agent, messages, "two")
    assert agent.writer.breaker.failures == 2
    s08.take_turn(agent, messages, "three")
    assert agent.writer.breaker.failures == 0 and "fine" in first_text(fake.main_requests[-1])


def test_compact_tool_runs_after_the_batch_and_the_turn_continues(s08, fake, make_agent):
    fake.reply(tool_uses([("bash", {"command": "echo built"}, "toolu_b"),
                          ("compact", {"focus": "keep the API design"}, "toolu_c")]),
               text("Continuing from the summary."))
    fake.summary(text("<summary>Built the thing.</summary>"))
    agent = make_agent()
    messages = chat_history(3, 4_000) + [user("build, then tidy up")]  # enough that a summary frees room
    final = s08.agent_loop(agent, messages)
    assert final == "Continuing from the summary."
    assert "keep the API design" in instruction(fake.summary_requests[0])
    second = fake.main_requests[1]["messages"]
    assert first_text(fake.main_requests[1]).startswith("[Compacted")
    assert blocks(second[0])[-1]["text"] == "build, then tidy up"
    assert [b["tool_use_id"] for b in second[-1]["content"]] == ["toolu_b", "toolu_c"]
    assert_requests_valid(fake)


def test_task_runs_a_subagent_with_fresh_history_and_no_task_tool(s08, fake, make_agent, workspace):
    (workspace / "x.py").write_text("")
    fake.reply(tool_use("task", {"prompt": "count the python files", "description": "count"}, "toolu_task"),
               tool_use("glob", {"pattern": "*.py"}),
               text("There is 1 python file."),
               text("The subagent found one file."))
    agent = make_agent()
    s08.agent_loop(agent, [user("how many python files?")])
    sub_first = fake.main_requests[1]
    assert plain(sub_first["messages"]) == [user("count the python files")]
    assert "task" not in [t["name"] for t in sub_first["tools"]]
    parent_result = plain(fake.main_requests[3]["messages"][-1]["content"][0])
    assert parent_result["tool_use_id"] == "toolu_task" and not parent_result.get("is_error")
    answer, _, saved = parent_result["content"].partition("\n\n")
    assert answer == "There is 1 python file.", "the subagent's final answer, then where its work is"
    assert re.fullmatch(r"\[the subagent's calls and results are saved at \.transcripts/task-[\w-]+\.jsonl\]", saved)
    assert_requests_valid(fake)


def test_a_subagent_starts_with_a_loop_state_of_its_own(s08, fake, make_agent, workspace):
    (workspace / "a.py").write_text("a = 1\n")
    fake.reply(tool_uses([("todo_write", {"items": [{"content": "parent job", "status": "in_progress"}]}),
                          ("read_file", {"path": "a.py"})]),
               tool_use("task", {"prompt": "plan the next step"}),
               tool_use("todo_write", {"items": [{"content": "child step", "status": "pending"}]}),  # the subagent
               tool_use("read_file", {"path": "a.py"}, "toolu_child_read"),
               text("planned"), text("done"))
    agent = make_agent()
    s08.agent_loop(agent, [user("go")])
    assert agent.state.todos == [{"content": "parent job", "status": "in_progress"}], "the child's list is its own"
    child_read = [b for m in fake.main_requests[4]["messages"] for b in blocks(m)
                  if b.get("tool_use_id") == "toolu_child_read"][0]
    assert "a = 1" in child_read["content"], "the parent's read is not in the child's context: no repeat-read stub"
    assert agent.subagent().state is not agent.state and agent.subagent().state.todos == []


def test_hooks_see_every_event(s08, fake, make_agent):
    seen = []
    agent = make_agent()
    for event in HOOK_EVENTS:
        agent.hooks[event].append(lambda payload, event=event: seen.append(event))
    agent.hooks["PreCompact"].append(lambda payload: {"instructions": "mention the hook"})
    agent.hooks["PreToolUse"].append(
        lambda payload: {"deny": "no writing today"} if payload["name"] == "write_file" else None)
    fake.reply(tool_uses([("write_file", {"path": "a.txt", "content": "x"}), ("bash", {"command": "true"})]),
               tool_use("compact", {}), text("done"))
    messages = []
    s08.take_turn(agent, messages, "go")
    assert seen == ["UserPromptSubmit", "PreToolUse", "PreToolUse", "PostToolUse", "PreToolUse", "PostToolUse",
                    "PreCompact", "RestoreContext", "PostCompact", "Stop"]
    denied = fake.main_requests[1]["messages"][-1]["content"][0]
    assert denied["is_error"] and denied["content"] == "no writing today"
    assert "mention the hook" in instruction(fake.summary_requests[0])


def test_a_user_prompt_hook_can_block_a_prompt(s08, fake, make_agent):
    agent = make_agent()
    agent.hooks["UserPromptSubmit"].append(lambda p: {"block": "no secrets"} if "password" in p["prompt"] else None)
    messages = []
    s08.take_turn(agent, messages, "my password is hunter2")
    assert messages == [] and fake.requests == [] and "no secrets" in agent.out.text


def test_a_passing_api_error_is_retried_with_a_notice(s08, fake, make_agent):
    fake.reply(error(529, "overloaded_error", "Overloaded"), error(429, "rate_limit_error", "Slow down"),
               text("Got through."))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "first")
    assert "[api] 529 overloaded_error: Overloaded; retrying in 0.0s (retry 1 of 3)" in agent.out.text
    assert "[api] 429 rate_limit_error: Slow down; retrying" in agent.out.text
    assert messages[-1]["content"] == [{"type": "text", "text": "Got through."}]


def test_api_errors_that_persist_print_one_line_and_the_session_goes_on(s08, fake, make_agent):
    fake.reply(*[error(500, "api_error", "Internal server error")] * endpoint.MAX_API_ATTEMPTS, text("Back again."))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "first")
    assert len(fake.main_requests) == endpoint.MAX_API_ATTEMPTS, "retries are bounded"
    assert "API error: 500 api_error: Internal server error" in agent.out.text
    assert "Your message was not answered and was taken back out; send it again" in agent.out.text and messages == []
    s08.take_turn(agent, messages, "second")
    assert messages[0]["content"] == [{"type": "text", "text": "second"}], "a prompt never answered is not sent twice"
    assert messages[-1]["content"] == [{"type": "text", "text": "Back again."}]
    assert_requests_valid(fake)


def test_a_stream_cut_mid_reply_is_retried_and_the_partial_reply_not_kept(s08, fake, make_agent):
    fake.reply(dict(tool_uses([("bash", {"command": "echo a"}), ("bash", {"command": "echo b"})], preface="Two calls."),
                    drop_after_block=1), text("Complete this time."))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "go")
    assert "stream ended before the message was complete" in agent.out.text and "retrying" in agent.out.text
    assert "● bash" not in agent.out.text, "the cut tool calls were not run"
    assert messages == [user("go"), {"role": "assistant", "content": [{"type": "text", "text": "Complete this time."}]}]
    assert_requests_valid(fake)


def test_a_stream_cut_every_time_ends_the_turn_cleanly(s08, fake, make_agent):
    fake.reply(*[dict(text("partial " * 50), drop_after_block=0)] * endpoint.MAX_API_ATTEMPTS, text("later"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "go")
    assert "API error: the reply stream ended before the message was complete" in agent.out.text
    assert messages == [], "the prompt the model never answered is withdrawn, to be sent again"


def test_unreachable_endpoint_is_reported_clearly(s08, make_agent):
    with FakeAnthropic() as dead:
        pass  # closed: nothing listens on its port any more
    agent = make_agent(server=dead)
    s08.take_turn(agent, [], "hello")
    assert f"cannot reach {dead.url}/v1/messages (" in agent.out.text and "ANTHROPIC_BASE_URL" in agent.out.text


def test_a_disk_that_cannot_be_written_keeps_content_in_context(s08, fake, make_agent, workspace):
    (workspace / ".task_outputs").write_text("a file where the folder should be")
    fake.reply(tool_use("bash", {"command": "head -c 300000 /dev/zero | tr '\\0' z"}), text("ok"))
    agent = make_agent(window=30_000)
    s08.agent_loop(agent, [user("go")])
    sent = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert not sent.startswith("<persisted-output") and len(sent) >= 200_000
    assert agent.out.text.count("cannot save to disk") == 1


def test_step_limit_ends_a_runaway_turn(s08, fake, make_agent):
    agent = make_agent(max_steps=3)
    fake.reply(*[tool_use("bash", {"command": "true"}) for _ in range(5)])
    messages = [user("loop forever")]
    assert s08.agent_loop(agent, messages) is None
    assert len(fake.main_requests) == 3 and "stopped after 3 model calls" in agent.out.text
    assert_valid(messages, "loop forever")


def test_a_subagent_at_its_step_limit_says_its_agent_is_told_not_to_send_a_message(s08, fake, make_agent, monkeypatch):
    """No one can send a subagent a message: at its limit the line says where the turn goes."""
    from s08_context_compact.command_line import agent as agent_module
    monkeypatch.setattr(agent_module, "SUBAGENT_MAX_STEPS", 2)
    agent = make_agent()
    fake.reply(tool_use("task", {"prompt": "loop forever"}, "toolu_task"),
               *[tool_use("bash", {"command": "true"}) for _ in range(2)], text("It stopped."))
    messages = [user("delegate")]
    assert s08.agent_loop(agent, messages) == "It stopped."
    assert "stopped after 2 model calls in one turn; the agent that gave it this task is told" in agent.out.text
    assert "send a message to continue" not in agent.out.text
    assert "(the subagent stopped without a final answer)" in json.dumps(fake.main_requests[-1]["messages"])


@pytest.mark.parametrize("window", [8_000, 20_000, 60_000])
def test_a_long_session_never_sends_an_invalid_request(s08, make_agent, workspace, window):
    """Reads of mixed sizes, parallel calls and chat, at several windows: the server rejects nothing."""
    for n in range(12):
        (workspace / f"f{n}.txt").write_text(f"file {n}\n" + "数据 data " * (300 * (n % 4 + 1)))
    with FakeAnthropic(context_window=window) as fake:
        agent = make_agent(window=window, server=fake)
        messages = []
        for turn in range(8):
            fake.reply(tool_uses([("read_file", {"path": f"f{(turn + k) % 12}.txt"}) for k in range(3)]),
                       tool_use("bash", {"command": f"cat f{turn}.txt f{turn + 1}.txt"}),
                       text(f"turn {turn} done"))
            s08.take_turn(agent, messages, f"turn {turn}: read some files")
            assert_valid(messages, f"turn {turn}: read some files")
        assert fake.rejections == [] or all(r.startswith("prompt is too long") for r in fake.rejections)
        assert "API error" not in agent.out.text
        assert_requests_valid(fake)
