"""Summaries that always succeed, what comes back after compaction, the ledger, read stubs."""

import json
from dataclasses import replace
import re

from conftest import assert_requests_valid, assert_valid, blocks, chat, of_what_snip_cut, plain, user
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, held, text, tool_use, tool_uses
from s08_context_compact.command_line.user_turns import add_user_text  # noqa: E402
from s08_context_compact.command_line import handle_command, open_session
from s08_context_compact.basics import discover_skills
from s08_context_compact.messages import estimate_tokens
from s08_context_compact.compaction import Settings


def first_texts(body):
    return [b["text"] for b in blocks(body["messages"][0]) if b.get("type") == "text"]


def instruction(body):
    return blocks(body["messages"][-1])[-1]["text"]


def saw_questions(body):
    """A summary that names every question its request holds, itself or in a summary in it."""
    seen = sorted({int(n) for n in re.findall(r"question (\d+)", json.dumps(body["messages"]))})
    return text("<summary>" + " ".join(f"question {n}" for n in seen) + " were answered.</summary>")


def test_a_history_twice_the_window_is_summarized_in_pieces_and_nothing_is_left_out(s08, make_agent):
    """What does not fit one summary request is summarized a piece at a time, each request the
    summary so far and the next piece, within the window; the last one holds the newest
    messages after that summary. Every question asked reaches the summary."""
    with FakeAnthropic(context_window=20_000) as fake:
        agent = make_agent(window=20_000, server=fake)
        messages = chat(20, 4_000) + [user("and now the release notes")]
        assert estimate_tokens(messages) > 2 * 20_000
        fake.default_summary = saw_questions
        fake.reply(text("Notes written."))
        s08.agent_loop(agent, messages)
        assert fake.rejections == [] and len(fake.summary_requests) >= 3, "pieces, then the last"
        first, *rest = fake.summary_requests
        assert first_texts(first)[0] == "[This is where the conversation starts.]"
        assert all(first_texts(r)[0].startswith("[The conversation before this point did not fit") for r in rest)
        assert plain(rest[-1]["messages"][-1])["content"][0] == {"type": "text", "text": "and now the release notes"}
        summary = first_texts(fake.main_requests[0])[0]
        assert all(f"question {n} " in summary + " " for n in range(20)), summary
        billed = sum(u["output_tokens"] for u in fake.usage_log)
        assert agent.usage_totals["output_tokens"] == billed, "every piece's call is counted"
        assert_valid(messages, "and now the release notes")


def test_a_too_large_summary_is_retried_shorter_then_replaced_by_a_fallback(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat(12, 2_000) + [user("carry on")]  # over the threshold, within one summary request
    huge = text("<summary>" + "detail " * 20_000 + "</summary>")
    fake.summary(huge, huge)
    s08.agent_loop(agent, messages)
    assert len(fake.summary_requests) == 2
    assert "too long, empty, or a tool call" in instruction(fake.summary_requests[1])
    compacted = first_texts(fake.main_requests[0])
    assert "Assembled without the model" in compacted[0] and "question 11" in compacted[0]
    assert compacted[-1] == "carry on"
    assert "summary by fallback" in agent.out.text and agent.writer.breaker.failures == 1
    total = s08.context_tokens(agent, fake.main_requests[0]["messages"])
    assert total < 0.25 * 20_000, "the compacted context stays under a quarter of the window"


def test_a_summary_reply_that_calls_a_tool_is_asked_again(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat(12, 2_000) + [user("carry on")]  # over the threshold, within one summary request
    fake.summary(tool_use("read_file", {"path": "notes.md"}), text("<summary>Fourteen questions answered.</summary>"))
    fake.reply(text("Carrying on."))
    s08.agent_loop(agent, messages)
    first, second = fake.summary_requests
    assert "tool_choice" not in first and first["tools"], "the request is the conversation's own, tools included"
    assert "a tool call" in instruction(second)
    assert "Fourteen questions answered." in first_texts(fake.main_requests[0])[0]
    assert "summary by the model" in agent.out.text and agent.writer.breaker.failures == 0
    assert_requests_valid(fake)


def test_a_summary_that_calls_a_tool_twice_is_said_to_have_called_a_tool_not_to_be_empty(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat(12, 2_000) + [user("carry on")]  # over the threshold, within one summary request
    fake.summary(tool_use("read_file", {"path": "notes.md"}), tool_use("bash", {"command": "ls"}))
    s08.agent_loop(agent, messages)
    assert "failed (1/3): the reply called a tool instead of writing the summary" in agent.out.text
    assert "Assembled without the model" in first_texts(fake.main_requests[0])[0]


def test_a_summary_built_without_the_model_keeps_the_summary_before_it(s08, fake, make_agent):
    """Compacted twice with the model failing: the second summary built without it still holds
    what the first said (the user's earlier requests), not only what came since."""
    agent = make_agent(window=20_000)
    odd = error(400, "invalid_request_error", "messages.0.content.0: something odd")  # not retried
    fake.summary(odd, odd, odd, odd)
    messages = chat(6, 2_000) + [user("Batch c: rename the parser")]
    messages = s08.compact_now(agent, messages + [{"role": "assistant", "content": [
        {"type": "text", "text": "Renamed."}]}])
    messages = messages + [user("Batch e: " + "e" * 6_000), {"role": "assistant", "content": [
        {"type": "text", "text": "Done with e."}]}] + chat(6, 2_000)
    messages = s08.compact_now(agent, messages)
    summary = first_texts({"messages": messages})[0]
    assert summary.count("Assembled without the model") >= 2, "the summary before it, inside it"
    assert "Batch c: rename the parser" in summary and "Batch e" in summary
    assert_valid(messages)


def test_a_shorter_second_summary_is_used(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat(12, 2_000) + [user("carry on")]  # over the threshold, within one summary request
    fake.summary(text("<summary>" + "detail " * 20_000 + "</summary>"), text("<summary>Short and right.</summary>"))
    s08.agent_loop(agent, messages)
    assert "Short and right." in first_texts(fake.main_requests[0])[0]
    assert "summary by the model" in agent.out.text and agent.writer.breaker.failures == 0


def test_an_empty_summary_falls_back_and_the_session_goes_on(s08, fake, make_agent):
    agent = make_agent(window=20_000)
    messages = chat(12, 2_000) + [user("carry on")]  # over the threshold, within one summary request
    fake.summary(text("<analysis>only thinking</analysis>"), text("<summary> </summary>"))
    assert s08.agent_loop(agent, messages) == "Done."
    assert "Assembled without the model" in first_texts(fake.main_requests[0])[0]


def test_after_compaction_the_work_comes_back_in_order(s08, fake, make_agent, workspace):
    (workspace / "a.py").write_text("def a():\n    return 1\n")
    (workspace / "b.py").write_text("def b():\n    return 2\n")
    (workspace / "skills" / "style").mkdir(parents=True)
    (workspace / "skills" / "style" / "SKILL.md").write_text("---\nname: style\ndescription: House style\n---\n"
                                                              "Use four spaces.\n")
    agent = make_agent()
    agent.skills = discover_skills([workspace / "skills"])
    fake.reply(tool_uses([("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"}),
                          ("load_skill", {"name": "style"})]),
               tool_use("todo_write", {"items": [{"content": "fix a.py", "status": "in_progress"},
                                                 {"content": "test b.py", "status": "pending"}]}),
               text("Both read."), text("Continuing."))
    messages = chat(3, 4_000)  # earlier work, so the summary frees room (a layer never grows the context)
    s08.take_turn(agent, messages, "read a.py and b.py; never change the public API")
    (workspace / "a.py").write_text("def a():\n    return 42\n")
    (workspace / "b.py").unlink()
    add_user_text(messages, "now the next step")
    messages[:] = s08.compact_now(agent, messages)
    s08.agent_loop(agent, messages)
    texts = first_texts(fake.main_requests[-1])
    expected = ["[Compacted: the earlier conversation was summarized",
                "[Restored after compaction: fact ledger]",
                "[Restored after compaction: recent user messages, newest first]",
                "[Restored after compaction: b.py] This file was read earlier and has since vanished",
                "[Restored after compaction: a.py, re-read from disk, it CHANGED",
                "[Restored after compaction: todo list]",
                "[Restored after compaction: skills loaded earlier] style",
                "now the next step"]
    assert len(texts) == len(expected), texts
    assert all(t.startswith(e) for t, e in zip(texts, expected)), [t[:70] for t in texts]
    assert "has since vanished" in texts[3] and "return 42" in texts[4]
    assert "[>] fix a.py" in texts[5]
    assert "- read a.py and b.py; never change the public API" in texts[2]
    assert '- the user said: "read a.py and b.py; never change the public API"' in texts[1]
    assert_requests_valid(fake)


def test_read_stub_for_an_unchanged_file_but_not_after_compaction(s08, fake, make_agent, workspace):
    (workspace / "notes.txt").write_text("line one\nline two\n")
    fake.reply(tool_use("read_file", {"path": "notes.txt"}, "toolu_r1"),
               tool_use("read_file", {"path": "notes.txt"}, "toolu_r2"), text("Same."),
               tool_use("read_file", {"path": "notes.txt"}, "toolu_r3"), text("Read again."))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "read it twice")
    results = {b["tool_use_id"]: b["content"] for m in messages for b in blocks(m) if b.get("type") == "tool_result"}
    assert "line one" in results["toolu_r1"]
    assert results["toolu_r2"].startswith("(unchanged: notes.txt") and "toolu_r1" in results["toolu_r2"]
    messages[:] = s08.compact_now(agent, messages)
    s08.take_turn(agent, messages, "read it once more")
    last = [b for b in blocks(messages[-2]) if b.get("type") == "tool_result"][0]
    assert "line one" in last["content"], "after compaction the content is no longer in context: no stub"


def test_a_changed_file_is_read_in_full(s08, fake, make_agent, workspace):
    (workspace / "n.txt").write_text("v1\n")
    agent = make_agent()
    fake.reply(tool_use("read_file", {"path": "n.txt"}), text("ok"))
    messages = []
    s08.take_turn(agent, messages, "read")
    (workspace / "n.txt").write_text("version two\n")
    fake.reply(tool_use("read_file", {"path": "n.txt"}), text("ok"))
    s08.take_turn(agent, messages, "read again")
    assert "version two" in [b for b in blocks(messages[-2]) if b.get("type") == "tool_result"][0]["content"]


def test_the_ledger_records_what_happened_and_checks_the_summary(s08, fake, make_agent, workspace):
    (workspace / "app.py").write_text("print('hi')\n")
    agent = make_agent()
    fake.reply(tool_uses([("read_file", {"path": "app.py"}),
                          ("bash", {"command": "printf 'FAILED tests/test_app.py::test_greets - assert\\n'; exit 1"}),
                          ("write_file", {"path": "fix.py", "content": "x = 1\n"})]),
               text("Tried."))
    messages = chat(3, 4_000)  # earlier work, so the summary frees room
    s08.take_turn(agent, messages, "Fix app.py. You must keep Python 3.9 support.\n不要修改测试文件。")
    ledger = agent.ledger
    assert list(ledger.reads) == ["app.py"] and list(ledger.writes) == ["fix.py"]
    assert ledger.commands[-1][1] == 1 and "tests/test_app.py::test_greets" in ledger.failing
    assert ledger.constraints == ["You must keep Python 3.9 support.", "不要修改测试文件。"]
    fake.summary(text("<summary>Read app.py and wrote fix.py; test_greets fails. Keep Python 3.9 "
                      "support.</summary>"))
    messages[:] = s08.compact_now(agent, messages)
    transcript = next((workspace / ".transcripts").glob("compact-*.jsonl"))
    event = json.loads(transcript.read_text().splitlines()[-1])
    kept, total, lost = ledger.check(event["summary"], agent.state.todos)
    assert (kept, total) == (4, 6) and {kind for kind, _ in lost} == {"failed command", "constraint"}
    assert "ledger check: the summary mentions 4 of 6 facts the hooks recorded" in agent.out.text
    assert event["ledger"]["retained"] == 4 and "constraint: 不要修改测试文件。" in event["ledger"]["lost"]
    assert "不要修改测试文件。" in first_texts({"messages": messages})[1], "the ledger is put back verbatim"


def test_the_loops_wait_for_a_summary_is_logged_and_shown_in_context(s08, fake, make_agent):
    """Each layer's run is logged with the time the loop spent in it: for a summary, its wait."""
    agent = make_agent()
    messages = open_session(agent, None)
    messages += chat(2, 4_000) + [user("go")]
    fake.summary(held(text("<summary>Shipped.</summary>"), seconds=0.2))
    messages[:] = s08.compact_now(agent, messages)
    records = [json.loads(line) for line in agent.log.path.read_text(encoding="utf-8").splitlines()]
    logged = [r for r in records if r.get("type") == "layer"]
    assert [r["layer"] for r in logged] == ["compact_history"] and logged[0]["seconds"] >= 0.2
    handle_command(agent, messages, "/context", s08.LESSON)
    shown = re.search(r"compact_history\s+1×\s+−\S+ in (\d+\.\d)s", agent.out.text)
    assert shown and float(shown.group(1)) >= 0.2, agent.out.text
    assert not re.search(r"micro_compact .* in ", agent.out.text), "a layer that never ran took no time"


def test_the_summary_is_shown_and_recorded(s08, fake, make_agent):
    agent = make_agent()
    fake.summary(text("<analysis>private</analysis><summary>1. Primary request: ship it.\n"
                      "2. Key concepts: none.</summary>"))
    messages = chat(2, 4_000) + [user("go")]
    messages[:] = s08.compact_now(agent, messages, focus="the release")
    assert "    1. Primary request: ship it." in agent.out.text and "private" not in agent.out.text
    assert "Focus especially on: the release" in instruction(fake.summary_requests[0])


def test_after_a_summary_later_layer_lines_do_not_repeat_it(s08, fake, make_agent):
    """Only the run that wrote a summary reports it; a later layer keeps the summary as the
    first message, and its line is about what it did."""
    agent = make_agent(window=20_000)
    fake.summary(text("<summary>1. Primary request: the old plan.</summary>"))
    messages = chat(2, 4_000) + [user("go")]
    messages[:] = s08.compact_now(agent, messages)
    for n in range(4):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"r{n}", "name": "read_file",
                                                        "input": {"path": f"f{n}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"r{n}",
                                                   "content": "x = 1\n" * 400}]}]
    before = len(agent.out)
    messages[:] = s08.apply_layer(agent, s08.micro_compact, messages, keep_recent=1, min_chars=120, clear_at_least=0,
                                  store=agent.store)
    later = "".join(agent.out[before:])
    assert later.startswith("[micro_compact] 3 old results"), later
    assert "summary by" not in later and "the old plan" not in later


def test_a_useless_summary_still_leaves_the_latest_failed_commands_error(s08, fake, make_agent, workspace):
    """Whatever the summary says, the end of the latest failed command's output comes back,
    so the model need not run the build again to see what broke."""
    agent = make_agent(window=32_000)
    fake.reply(tool_use("bash", {"command": "echo 'ld: error: undefined symbol: frobnicate_v2' && exit 2"}),
               text("The build failed."), text("Looking at it."))
    fake.summary(text("<summary>Some work was done.</summary>"))
    messages = chat(4, 3_000)  # enough before it for a summary to be worth making
    assert s08.take_turn(agent, messages, "build it")
    handle_command(agent, messages, "/compact", s08.LESSON)
    assert s08.take_turn(agent, messages, "why did it fail?")
    sent = json.dumps(fake.main_requests[-1]["messages"])
    assert "undefined symbol: frobnicate_v2" in sent and "(exit 2)" in sent


def test_the_ledger_checks_list_is_cut_between_names_and_says_how_many_more():
    from s08_context_compact.compaction.ledger import listed
    assert listed("a.txt; b.txt; c.txt", 10) == "a.txt; and 2 more"
    assert listed("a.txt; b.txt", 100) == "a.txt; b.txt"


def test_what_snip_cut_is_summarized_in_the_background_and_every_call_stays_in_view(s08, tmp_path):
    """A session played against the fake at 30k: snip cuts the middle, and what it cut is
    summarized in a request of its own, near snip's trigger ahead of the cut. From the requests
    the server saw: every call the model made is in the last request, or in a summary request
    (the part written out) whose summary that request holds; the summary joined the end of the
    context, in the request where the snip cut its part (which rewrote the cache there anyway),
    or later without changing a message before it, so the prompt cache holds."""
    import benchmark
    session = benchmark.scripted_session(7, 16)
    settings = replace(Settings.for_window("claude-benchmark", 30_000), summary_ahead=None,
                       snip_summary_waits=True)
    fake_seen = []
    played = benchmark.play(s08, session, settings, tmp_path, seen=fake_seen.append)
    fake = fake_seen[0]
    snips = played["compactions"]["snip_compact"]
    of_parts = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert snips >= 2 and len(of_parts) == snips, (snips, len(of_parts))
    assert all(not r.get("tools") for r in of_parts), "a request of its own"
    assert played["calls in view"] == 1.0
    mains = [plain(r["messages"]) for r in fake.main_requests]
    joined = [k for k, sent in enumerate(mains) if "what snip cut earlier" in json.dumps(sent[-1])
              and "what snip cut earlier" not in json.dumps(mains[k - 1][-1])]
    assert len(joined) >= 2
    snip_notes = [[b["text"] for m in sent for b in m["content"] if b.get("text", "").startswith("[Snipped ")]
                  for sent in mains]
    for k in joined:
        if snip_notes[k] == snip_notes[k - 1]:  # joined later: the prefix is the cache's
            assert mains[k][:len(mains[k - 1])] == mains[k - 1], "every message before it as it was"
        else:  # joined with its snip: the snip's note, then the summary of what it cut
            assert any("Snipped" in text for text in snip_notes[k])
    at_their_snip = [k for k in joined if snip_notes[k] != snip_notes[k - 1]]
    assert at_their_snip, "a summary written ahead joins the request where its part is cut"


def test_context_says_what_snip_cut_waits_for_the_next_summary_and_the_summary_reads_it_back(s08, fake, make_agent):
    from test_summary_ahead import notes_read
    agent = make_agent()
    messages = notes_read(30)
    messages[:] = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                                  store=agent.store, tools=agent.tools)
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "What snip cut, waiting to be summarized: 1 transcript" in agent.out.text
    fake.summary(text("<summary>Thirty notes read.</summary>"))
    messages[:] = s08.compact_now(agent, messages)
    sent = json.dumps(fake.summary_requests[-1]["messages"])
    assert "(call r1):" in sent and "note 1 yyy" in sent, "the snipped calls, read back for the summary"
    before = len(agent.out)
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "waiting to be summarized" not in "".join(agent.out[before:])


def calls_seen(body):
    """A summary that names every call its request holds, written out or in a summary in it."""
    seen = sorted(set(re.findall(r"\(call (r\d+)\):|calls named: ([\w ]+)|\"id\": \"(r\d+)\"",
                                 json.dumps(body["messages"]))))
    names = sorted({n for pair in seen for group in pair for n in group.split()} - {""})
    return text("<summary>calls named: " + " ".join(names) + "</summary>")


def test_what_snip_cut_that_does_not_fit_one_request_is_read_back_in_pieces(s08, make_agent):
    """A snip's read-back bigger than a summary request can hold is summarized a part at a time:
    every call it held reaches the summary."""
    from test_summary_ahead import notes_read
    with FakeAnthropic(context_window=30_000) as fake:
        agent = make_agent(window=30_000, server=fake)
        messages = notes_read(160)
        messages[:] = s08.snip_compact(messages, keep_head=3, keep_tail=40, at_least=20, store=agent.store,
                                       tools=agent.tools)
        fake.default_summary = calls_seen
        messages[:] = s08.compact_now(agent, messages)
        assert fake.rejections == [] and len(fake.summary_requests) >= 3
        summary = first_texts({"messages": messages})[0]
        missing = [n for n in range(160) if f"r{n} " not in summary + " "]
        assert not missing, missing


def test_after_too_long_a_summary_is_asked_again_sized_to_the_window_learned(s08, make_agent):
    """CONTEXT_WINDOW says 32k, the endpoint holds 10k: the first summary request is refused,
    and the retries are sized to the window the refusal taught (pieces that fit, a reply's
    room that fits), so the model still writes the summary."""
    with FakeAnthropic(context_window=10_000, overflow="anthropic") as server:
        agent = make_agent(window=32_000, server=server)
        messages = chat(8, 4_000) + [user("carry on")]
        server.default_summary = lambda body: text("<summary>questions answered.</summary>")
        s08.compact_now(agent, messages)
        assert "summary by the model" in agent.out.text
        assert all(r["max_tokens"] <= 10_000 // 4 for r in server.summary_requests[1:])


def test_a_summary_that_fails_in_a_subagent_counts_for_the_session(s08, fake, make_agent):
    """Two summaries failed in a row in the main loop, the third in a subagent: the breaker
    opens for the session, and the main loop asks for no more."""
    agent = make_agent(window=20_000)
    agent.writer.breaker.failures = 2
    huge = text("<summary>" + "detail " * 20_000 + "</summary>")
    fake.summary(huge, huge)
    s08.compact_now(agent.subagent(), chat(12, 2_000) + [user("carry on")])
    assert len(fake.summary_requests) == 2 and agent.writer.breaker.failures == 3
    s08.compact_now(agent, chat(12, 2_000) + [user("carry on")])
    assert len(fake.summary_requests) == 2, "the breaker is open in the main loop too"
    assert "no more summary calls this session" in agent.out.text


def test_a_subagent_keeps_the_sessions_open_breaker(s08, fake, make_agent):
    """Three summaries failed in a row: no more summary calls this session, a subagent's
    included."""
    agent = make_agent(window=20_000)
    agent.writer.breaker.failures = 3
    assert agent.writer.breaker_open()
    sub = agent.subagent()
    fake.summary(text("<summary>paid for again</summary>"))
    s08.compact_now(sub, chat(12, 2_000) + [user("carry on")])
    assert not fake.summary_requests and "summary by fallback" in agent.out.text
