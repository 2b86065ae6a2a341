"""Token accounting anchored to usage, prompt caching, and cache-aware compaction."""

import json
from types import SimpleNamespace

from conftest import assert_requests_valid, assert_valid, blocks, plain, user
from conftest import chat as _chat
from s08_context_compact.compaction import Store
from s08_context_compact.endpoint import CACHE_TTLS
from s08_context_compact.messages import estimate_tokens, OWN


def chat(turns, size):
    return _chat(turns, size, word="talk ")
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, count_tokens, text, tool_use, tool_uses
from s08_context_compact.command_line import work_lines as report  # noqa: E402
from s08_context_compact.command_line.user_turns import add_user_text  # noqa: E402


def marked_prefix(body):
    """Everything in a request up to (and including) its last cache_control mark, unmarked."""
    system = [{"type": "text", "text": body["system"]}] if isinstance(body["system"], str) else body["system"]
    flat = [["tools", t] for t in body["tools"]] + [["system", b] for b in system]
    for i, message in enumerate(body["messages"]):
        flat += [[f"{i}:{message['role']}", b] for b in blocks(message)]
    last = max(n for n, (_, b) in enumerate(flat) if "cache_control" in b)
    return json.dumps(plain(flat[:last + 1]), sort_keys=True)


def test_context_size_comes_from_usage_not_the_character_estimate(s08, make_agent):
    # This server's tokenizer counts ASCII at 1.5 characters a token: far more than the estimate.
    with FakeAnthropic(context_window=20_000, chars_per_token=1.5) as fake:
        agent = make_agent(window=20_000, server=fake)
        size = 100
        while count_tokens(s08.build_request(agent, chat(6, size)), 1.5) < agent.settings.threshold + 1_000:
            size += 20
        messages = chat(6, size) + [user("first question")]
        fake.reply(text("first answer"), text("second answer"))
        s08.agent_loop(agent, messages)
        usage = fake.usage_log[0]
        measured = sum(usage[k] for k in ("input_tokens", "cache_read_input_tokens",
                                          "cache_creation_input_tokens", "output_tokens"))
        assert s08.context_tokens(agent, messages) == measured
        estimate = agent.overhead + estimate_tokens(messages)
        assert estimate < agent.settings.threshold < measured < 20_000, "the estimate alone would not compact"
        add_user_text(messages, "second question")
        s08.agent_loop(agent, messages)
        assert len(fake.summary_requests) == 1, "the measured size triggers compact_history"
        assert fake.rejections == []


def test_only_what_changed_since_the_last_response_is_estimated(s08, make_agent, fake):
    agent = make_agent()
    messages = [user("hello")]
    fake.reply(text("hi"))
    s08.agent_loop(agent, messages)
    anchored = s08.context_tokens(agent, messages)
    added = user("a follow-up " * 50)
    assert s08.context_tokens(agent, messages + [added]) == anchored + estimate_tokens([added])
    rewritten = [user("hello, changed")] + messages[1:]
    delta = estimate_tokens(rewritten[:1]) - estimate_tokens(messages[:1])
    assert s08.context_tokens(agent, rewritten) == anchored + delta


def test_near_the_threshold_count_tokens_decides(s08, make_agent):
    # At 3.5 characters a token the server counts a little more than the estimate.
    with FakeAnthropic(context_window=20_000) as fake:
        agent = make_agent(window=20_000, server=fake)
        threshold = agent.settings.threshold
        size = 1
        while agent.overhead + estimate_tokens(chat(3, size)[:5]) < threshold * 0.95:
            size += 20
        messages = chat(3, size)[:5]  # estimate within the margin below the threshold
        assert count_tokens(s08.build_request(agent, messages)) > threshold
        assert agent.overhead + estimate_tokens(messages) < threshold, "the estimate alone would not compact"
        fake.reply(text("ok"))
        s08.agent_loop(agent, messages)
        assert fake.count_token_calls >= 1
        assert len(fake.summary_requests) == 1, "the exact count is over the threshold"


def test_count_tokens_missing_is_remembered(s08, make_agent, fake):
    agent = make_agent(window=20_000, server=SimpleNamespace(url=fake.url + "/nothing-here"))
    threshold, words = agent.settings.threshold, 10
    while s08.context_tokens(agent, [user("word " * words)]) < threshold * 0.95:
        words += 50
    messages = [user("word " * words)]  # near the threshold: the exact count is asked for
    assert not s08.over_threshold(agent, messages)  # the endpoint has none: the estimate stands
    assert agent.endpoint.can_count_tokens is False


def test_cjk_heavy_history_does_not_overflow(s08, make_agent, workspace):
    for n in range(10):
        (workspace / f"笔记{n}.md").write_text("上下文压缩的中文笔记。" * (250 + 40 * n))
    with FakeAnthropic(context_window=12_000) as fake:
        agent = make_agent(window=12_000, server=fake)
        messages = []
        for n in range(10):
            fake.reply(tool_use("read_file", {"path": f"笔记{n}.md"}), text(f"第{n}个文件读完了。"))
            s08.take_turn(agent, messages, f"请读第{n}个文件")
            assert_valid(messages, f"请读第{n}个文件")
        assert fake.rejections == [], "a 4-characters-a-token estimate would have overflowed here"
        assert "API error" not in agent.out.text
        assert max(count_tokens(r) for r in fake.valid_requests) <= 12_000


def reads(prompt: str, count: int, lines: int) -> list:
    """A prompt, then `count` file reads of `lines` lines each, one call at a time."""
    history = [user(prompt)]
    for n in range(count):
        history += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"r{n}", "name": "read_file",
                                                       "input": {"path": f"f{n}.py"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"r{n}",
                                                  "content": f"# file {n}\n" + "x = 1\n" * lines}]}]
    return history


def test_a_clearing_rewrites_only_after_the_clearing_point_and_the_prefix_before_it_is_read(s08, make_agent):
    with FakeAnthropic(context_window=30_000) as fake:
        agent = make_agent(window=30_000, server=fake)
        history = reads("read them, and keep to the plan: " + "step by step, " * 300, 8, 700)  # a prefix worth caching
        request = s08.build_request(agent, history)
        marked = [i for i, m in enumerate(request["messages"]) if "cache_control" in m["content"][-1]]
        assert marked == [1, len(history) - 3, len(history) - 1], "the clearing point: the call of the oldest result"
        assert 1 + len(marked) <= 4, "with the last tool's mark, within the API's four"
        fake.reply(text("ok"), text("ok"))
        s08.call_model(agent, history)
        cleared = s08.micro_compact(history, keep_recent=1, min_chars=120, clear_at_least=0, store=Store(agent.workdir))
        s08.call_model(agent, cleared)
        usage = fake.usage_log[-1]
        assert usage["cache_read_input_tokens"] > 0, "tools, system and the first message are read after the clearing"


def test_cache_breakpoints_are_stable_across_two_ordinary_turns(s08, make_agent, fake, workspace):
    (workspace / "notes.md").write_text("setup notes\n" * 600)
    fake.reply(tool_use("read_file", {"path": "notes.md"}), text("Read it."), text("Second answer."))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "read notes.md")
    s08.take_turn(agent, messages, "thanks")
    first, second, third = fake.main_requests
    # the system prompt is a plain string (servers such as llama.cpp take nothing else); the
    # fixed prefix's mark is on the last tool
    assert isinstance(first["system"], str) and first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" in blocks(third["messages"][-1])[-1]
    for earlier, later in ((first, second), (second, third)):
        # the bytes up to the earlier request's last mark are repeated exactly
        prefix = marked_prefix(earlier)
        assert marked_prefix(later).startswith(prefix[:-1])
    # the first prefix is under the 1,024-token minimum, as with the real API; after that,
    # each request reads everything the previous one sent
    second, third_usage = fake.usage_log[1], fake.usage_log[2]
    assert second["cache_creation_input_tokens"] > 1_024
    sent_before = second["input_tokens"] + second["cache_read_input_tokens"] + second["cache_creation_input_tokens"]
    assert third_usage["cache_read_input_tokens"] >= sent_before - 50
    assert json.dumps(messages).count("cache_control") == 0, "marks never enter the history"
    assert_requests_valid(fake)


def test_a_session_reads_most_of_its_prompt_from_the_cache(s08, make_agent, workspace):
    for n in range(8):
        (workspace / f"m{n}.py").write_text(f"# module {n}\n" + "def f(): return 1\n" * 150)
    with FakeAnthropic() as fake:
        agent = make_agent(server=fake)
        messages = []
        for n in range(8):
            fake.reply(tool_uses([("read_file", {"path": f"m{n}.py"}), ("glob", {"pattern": "*.py"})]),
                       text(f"module {n} read"))
            s08.take_turn(agent, messages, f"read m{n}.py")
        later = fake.usage_log[2:]
        read = sum(u["cache_read_input_tokens"] for u in later)
        sent = sum(u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] + u["input_tokens"] for u in later)
        assert read / sent > 0.8


def test_the_status_line_says_when_the_context_is_already_over_the_threshold(s08, make_agent):
    agent = make_agent(window=20_000)
    assert "auto-compact in " in report.status_line(agent.settings, s08.context_tokens(agent, [user("hi")]))
    over = report.status_line(agent.settings, s08.context_tokens(agent, [user("x" * 4 * agent.settings.threshold)]))
    assert "over the auto-compact threshold" in over and "auto-compact in" not in over


def test_after_the_cache_has_expired_snip_and_micro_act_below_their_trigger(s08, make_agent):
    agent = make_agent(window=30_000)
    history = reads("read them", 8, 500)
    size = s08.context_tokens(agent, history)
    s = agent.settings
    assert s.micro_trigger * s08.COLD_TRIGGER_SHARE < size < s.micro_trigger, "between the cold and warm triggers"
    agent.state.last_reply_at = agent.clock() - 60  # a minute ago: the cache is warm, clearing would cost
    assert s08.compact_pipeline(agent, history) is history
    agent.state.last_reply_at = agent.clock() - CACHE_TTLS["5m"] - 60  # past the cache's life
    cleared = s08.compact_pipeline(agent, history)
    placeholders = [b for m in cleared for b in blocks(m) if b.get(OWN) == "placeholder"]
    assert len(placeholders) == 8 - s.keep_recent, "everything clearable is cleared: the cache is cold anyway"


def test_micro_compaction_waits_for_its_trigger_and_clears_at_least_the_minimum(s08, make_agent, workspace):
    for n in range(36):
        (workspace / f"f{n}.txt").write_text(f"file {n}\n" + "content line\n" * 240)
    with FakeAnthropic(context_window=40_000) as fake:
        agent = make_agent(window=40_000, server=fake)
        messages = []
        for turn in range(12):  # 48 messages: snip_compact stays out of it
            fake.reply(tool_uses([("read_file", {"path": f"f{3 * turn + k}.txt"}) for k in range(3)]),
                       text(f"read batch {turn}"))
            s08.take_turn(agent, messages, f"read batch {turn}")
        assert "snip_compact" not in agent.stats
        runs = agent.stats["micro_compact"]["runs"]
        assert 1 <= runs <= 3, f"micro_compact ran {runs} times in 12 turns"
        assert agent.stats["micro_compact"]["saved"] / runs >= agent.settings.clear_at_least
        assert fake.rejections == []


def test_the_summary_request_continues_the_cached_conversation(s08, make_agent, workspace):
    (workspace / "spec.md").write_text("requirement\n" * 800)
    with FakeAnthropic() as fake:
        agent = make_agent(server=fake)
        messages = []
        fake.reply(tool_use("read_file", {"path": "spec.md"}), text("Read the spec."))
        s08.take_turn(agent, messages, "read the spec")
        fake.summary(text("<summary>Read the spec.</summary>"))
        messages[:] = s08.compact_now(agent, messages, focus="keep the requirements")
        summary = fake.summary_requests[0]
        assert "tool_choice" not in summary and summary["tools"] == fake.main_requests[0]["tools"], \
            "a changed tool_choice would invalidate the cached messages"
        assert plain(summary["system"]) == plain(fake.main_requests[-1]["system"])
        usage = [u for u in fake.usage_log if u["summary"]][0]
        sent = usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"] + usage["input_tokens"]
        assert usage["cache_read_input_tokens"] / sent > 0.8
        assert_valid(messages)


def test_piped_output_has_no_status_line_and_no_escape_codes(fake, workspace):
    from conftest import run_cli
    done = run_cli(fake, workspace, "hello\n")
    assert "auto-compact in" not in done.stdout and "\033[" not in done.stdout
    assert "\r" not in done.stdout, "no spinner when the output is not a terminal"


def test_the_spinner_shows_elapsed_seconds_and_erases_itself():
    import io
    from conftest import wait_until
    from s08_context_compact.basics import Spinner
    quick = io.StringIO()
    with Spinner(quick, "running bash"):
        pass
    assert quick.getvalue() == "\r\033[K", "quick work draws nothing but the erase"
    slow = io.StringIO()
    with Spinner(slow, "waiting for the model"):
        wait_until(lambda: "waiting for the model 0." in slow.getvalue())  # drawn after half a second
    assert slow.getvalue().endswith("\r\033[K")
    with Spinner(None, "off when not a terminal") as off:
        assert off.thread is None, "no stream: nothing is started, so nothing can be drawn"
