"""Compact before you must: a summary written in the background from an early mark, swapped
in at the threshold, with every outcome of one in flight defined. The fake's summary replies
are held until the test releases them (`held(reply, gate)`), so nothing here waits on time."""

import _thread
import json
import re
import os
import signal
import threading
from dataclasses import replace

import pytest

import cli_runner
from conftest import Printed, Terminal, assert_valid, cli_env, context_breakdown, of_what_snip_cut, run_cli, wait_until
from s08_context_compact.offline.fake_anthropic import count_tokens, error, held, server_error, text, tool_use
from s08_context_compact.command_line import handle_command, open_session, take_line

WINDOW = 24_000              # threshold 15,600 tokens
EARLY = (0.6, 0.6)           # the early mark held at 60% of the threshold, so the tests know when it comes
SUMMARY = "AHEAD-SUMMARY: files out/f0 onwards were written."


def write(k: int, size: int = 3_000) -> dict:
    """A step that adds about 800 tokens no cheap layer can clear (a call's input)."""
    return tool_use("write_file", {"path": f"out/f{k}.txt", "content": f"file {k} " + "x" * size})


def read_pair(name: str, result: str) -> list:
    """A read_file call and its result, as the history holds them."""
    return [{"role": "assistant", "content": [{"type": "tool_use", "id": name, "name": "read_file",
                                              "input": {"path": f"{name}.md"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": name, "content": result}]}]


def notes_read(count: int) -> list:
    """A request, then `count` notes read, about 550 tokens each."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "read the notes"}]}]
    for k in range(count):
        messages += read_pair(f"r{k}", f"note {k} " + "y" * 2_000)
    return messages


def start_now(s08, agent, messages: list) -> None:
    """A summary written ahead of the history as it stands, wherever the early mark is."""
    settings = agent.settings
    agent.settings = replace(settings, summary_ahead=(0.0, 0.0))
    try:
        s08.summarize_ahead(agent, messages)
    finally:
        agent.settings = settings
    assert agent.ahead.job


def ahead_agent(make_agent, out=None):
    agent = make_agent(window=WINDOW, out=out)
    agent.settings = replace(agent.settings, summary_ahead=EARLY)
    return agent


def plain(value):
    """A request's messages without cache marks (the only thing a swap may change in them)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def first_with(fake, needle: str) -> int:
    return next(i for i, r in enumerate(fake.main_requests) if needle in json.dumps(r["messages"][0]))


def summaries_before(fake, request: dict) -> int:
    """Summary requests the server saw before this request, of the history before the swap (the
    next summary may start right after the swap, of the swapped history, before this request)."""
    return sum(1 for r in fake.requests[:fake.requests.index(request)]
               if r in fake.summary_requests and SUMMARY not in json.dumps(r["messages"][0])
               and not of_what_snip_cut(r))


class Watching(Printed):
    """Printed, calling `on_line(text)` for each line the agent says."""

    def __init__(self, on_line):
        super().__init__()
        self.on_line = on_line

    def __call__(self, *parts, **kwargs):
        super().__call__(*parts, **kwargs)
        self.on_line(" ".join(map(str, parts)))


def test_the_loop_goes_on_while_the_summary_is_written_and_the_swap_keeps_what_came_after(s08, fake, make_agent):
    agent, gate, seen = ahead_agent(make_agent), threading.Event(), []
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), gate=gate))

    def step(body):
        if agent.ahead.job:  # started: its request is on its way (the worker makes its client first)
            wait_until(lambda: fake.summary_requests)
        seen.append((len(fake.summary_requests), gate.is_set()))
        if sum(1 for summaries, _ in seen if summaries) == 3:  # three steps served while it was written
            gate.set()
        return write(len(seen))

    fake.reply(*[step] * 20, text("All written."))
    assert s08.take_turn(agent, (messages := []), "write the files")
    assert_valid(messages)
    # steps were answered while the summary was being written, before its answer was let go
    assert sum(1 for summaries, released in seen if summaries and not released) >= 3
    swap = first_with(fake, SUMMARY)
    assert summaries_before(fake, fake.main_requests[swap]) == 1  # none written at the threshold as well
    snapshot = fake.summary_requests[0]["messages"]
    covered, before, after = len(snapshot), fake.main_requests[swap - 1], fake.main_requests[swap]
    # the request after the swap: the summary, then every message after the snapshot, verbatim
    assert plain(after["messages"][1:]) == plain(before["messages"][covered:] + after["messages"][-2:])
    assert plain(snapshot[:-1]) == plain(before["messages"][:covered - 1])  # the snapshot was the history then
    printed = agent.out.text
    assert "[summary ahead] writing a summary of" in printed and "the work waited 0.0s" in printed
    # the files written after the snapshot are in what is kept, not lost with the summary
    kept = re.search(r"ledger check: the summary mentions (\d+) of (\d+) facts", printed)
    assert kept and 0 < int(kept.group(1)) < int(kept.group(2))
    assert "waiting for the summary" not in printed
    # the background request read what the foreground had cached
    usage = next(u for u in fake.usage_log if u["summary"])
    assert usage["cache_read_input_tokens"] > 4 * (usage["input_tokens"] + usage["cache_creation_input_tokens"])


def test_still_in_flight_at_the_threshold_the_loop_waits_for_it(s08, fake, make_agent):
    gate = threading.Event()
    agent = ahead_agent(make_agent, Watching(lambda line: "waiting for the summary" in line and gate.set()))
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), gate=gate))
    fake.reply(*[write(k) for k in range(20)], text("All written."))
    assert s08.take_turn(agent, (messages := []), "write the files")
    printed = agent.out.text
    # the wait began, and only then was the answer let go; it was used, not written again
    assert printed.index("waiting for the summary") < printed.index("swapped in")
    assert summaries_before(fake, fake.main_requests[first_with(fake, SUMMARY)]) == 1
    assert_valid(messages)


def test_a_summary_in_flight_that_more_came_after_is_used_not_written_again(s08, fake, make_agent):
    """A tight window: the summary starts early and the steps fill the room before it is back.
    At the threshold the loop waits for the rest of it, swaps it in and shortens what came after
    it without a call; no second summary is asked for while it runs."""
    gate = threading.Event()
    agent = ahead_agent(make_agent, Watching(lambda line: "waiting for the summary" in line and gate.set()))
    for k in range(8):
        (agent.workdir / f"n{k}.md").write_text(f"note {k}\n" + ("y" * 79 + "\n") * 60)
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), gate=gate))
    # reads to the mark, then writes: micro_compact clears the reads the summary covers, and more
    # than half the threshold comes after its snapshot
    reads = [tool_use("read_file", {"path": f"n{k}.md"}) for k in range(8)]
    fake.reply(*reads, *[write(k) for k in range(24)], text("All written."))
    assert s08.take_turn(agent, (messages := []), "write the files")
    assert_valid(messages)
    printed = agent.out.text
    assert "called off" not in printed and "set aside" not in printed
    assert printed.index("waiting for the summary") < printed.index("swapped in")
    swap = fake.main_requests[first_with(fake, SUMMARY)]
    assert summaries_before(fake, swap) == 1  # the one in flight, and no other at the threshold
    snapshot = fake.summary_requests[0]["messages"]
    before = fake.main_requests[fake.main_requests.index(swap) - 1]["messages"]
    assert count_tokens({"messages": before[len(snapshot):]}) > agent.settings.threshold // 2
    # the call being worked on and its results stay; what came after the snapshot and is not
    # kept in context was saved first
    call, results = swap["messages"][-2:]
    assert results["content"][0]["tool_use_id"] == call["content"][0]["id"] and "write the files" in json.dumps(swap)
    kept = json.dumps(swap["messages"])
    saved = "".join(path.read_text() for path in (agent.workdir / ".transcripts").glob("*.jsonl"))
    paths = set(re.findall(r"out/f\d+\.txt", json.dumps(before[len(snapshot):])))
    assert paths and all(path in kept or path in saved for path in paths)
    assert count_tokens(swap) < agent.settings.threshold
    assert agent.ahead.discarded == 0 and agent.ahead.used >= 1


def start_one_in_flight(s08, fake, make_agent, out=None):
    """An agent whose turn ended after the early mark and before the threshold: a summary in flight, held."""
    agent, gate = ahead_agent(make_agent, out), threading.Event()
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), gate=gate))
    fake.reply(*[write(k) for k in range(10)], text("Ten written."))
    messages = []
    assert s08.take_turn(agent, messages, "write ten files")
    job = agent.ahead.job
    assert job is not None and not job.done.is_set()
    wait_until(lambda: fake.summary_requests)
    return agent, messages, job


def called_off(fake, job) -> None:
    """The worker is gone and its request was not left hanging: the server saw the client go."""
    assert not job.thread.is_alive()
    wait_until(lambda: "client closed" in fake.stalls)


def test_clear_calls_off_the_summary_in_flight(s08, fake, make_agent):
    agent, messages, job = start_one_in_flight(s08, fake, make_agent)
    assert "one being written, of the first" in context_breakdown(s08, agent, messages)
    take_line(agent, messages, "/clear", s08.LESSON)
    called_off(fake, job)
    assert messages == [] and "[summary ahead] called off: /clear" in agent.out.text
    assert agent.ledger.lines() == [], "the facts of the old conversation do not come back in the new one"
    fake.reply(text("Hello again."))
    assert s08.take_turn(agent, messages, "hello")
    assert SUMMARY not in json.dumps(fake.main_requests[-1]) and len(messages) == 2


def test_compact_with_a_focus_calls_it_off_and_summarizes_now(s08, fake, make_agent):
    agent, messages, job = start_one_in_flight(s08, fake, make_agent)
    fake.summary(text("<summary>FOCUSED summary of the writes.</summary>"))
    take_line(agent, messages, "/compact the files written", s08.LESSON)
    called_off(fake, job)
    assert "FOCUSED summary" in json.dumps(messages[0]) and SUMMARY not in json.dumps(messages)
    assert "Focus especially on: the files written" in json.dumps(fake.summary_requests[-1]["messages"][-1])
    assert_valid(messages)


def test_a_second_ctrl_c_while_waiting_for_the_same_summary_calls_it_off(s08, fake, make_agent):
    agent = ahead_agent(make_agent, Watching(lambda line: "waiting for the summary" in line and _thread.interrupt_main()))
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), seconds=60))  # not let go in time
    fake.reply(*[write(k) for k in range(20)], text("All written."))
    messages = []
    assert take_line(agent, messages, "write the files", s08.LESSON)
    job = agent.ahead.job
    assert "it goes on in the background" in agent.out.text and job and job.thread.is_alive()
    assert take_line(agent, messages, "go on", s08.LESSON)  # at the threshold it is waited for again
    assert "Ctrl-C again calls it off" in agent.out.text
    assert "called off: Ctrl-C again while waiting for it" in agent.out.text and agent.ahead.job is None
    called_off(fake, job)
    assert_valid(messages)
    assert SUMMARY not in json.dumps(messages)
    fake.reply(text("Carrying on."))
    assert s08.take_turn(agent, messages, "go on")  # the next turn compacts as it would have


def test_after_ctrl_c_during_the_wait_the_summary_in_flight_is_the_one_swapped_in(fake, workspace):
    """On a terminal: Ctrl-C while the loop waits for a summary written ahead ends the turn;
    the summary is finished in the background, and the next prompt swaps it in without
    asking for another."""
    gate = threading.Event()
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), gate=gate))
    fake.reply(*[write(k) for k in range(20)])
    terminal = Terminal(fake, workspace, columns=200, CONTEXT_WINDOW=WINDOW, SUMMARY_AHEAD="0.6-0.6")
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b"write the files\r")
    assert terminal.read_until(b"(Ctrl-C stops waiting)")
    terminal.type(b"\x03")
    assert terminal.read_until(b"s08 >> ", 2)
    assert "it goes on in the background" in terminal.text and "called off" not in terminal.text
    gate.set()  # its answer goes only now, after the interruption
    wait_until(lambda: any(u["summary"] for u in fake.usage_log))
    fake.replies.clear()
    fake.reply(text("Carrying on."))
    assert terminal.turn(b"go on\r")
    assert terminal.finish() == 0
    assert "swapped in" in terminal.text and "Carrying on." in terminal.text
    swap = fake.main_requests[first_with(fake, SUMMARY)]
    assert summaries_before(fake, swap) == 1, "no second summary was asked for"
    last = fake.main_requests[-1]["messages"]
    assert SUMMARY in json.dumps(last[0]) and "go on" in json.dumps(last[-1])


def test_a_summarizer_that_always_fails_is_called_three_times_in_all(s08, fake, make_agent):
    """Summaries written ahead and summaries at the threshold count in one breaker: a failed
    one written ahead (its fallback swapped in) counts as much as one at the threshold, and
    the breaker stops both kinds."""
    agent = ahead_agent(make_agent)
    fake.default_summary = error(400, "invalid_request_error", "the summarizer is down")
    half = "x" * 4 * (agent.settings.threshold // 2 - 1)  # the largest prompt sent whole: half the threshold
    messages = []
    for prompt in ["start", half, *["go on", half] * 4]:
        assert s08.take_turn(agent, messages, prompt)
        if agent.ahead.job:  # started in this turn: let it fail before the next prompt
            wait_until(lambda: agent.ahead.job.done.is_set())
    printed = agent.out.text
    assert "[summary ahead] writing a summary" in printed and "summary by fallback" in printed
    assert "[compact_history]" in printed  # summaries asked for at the threshold as well
    assert len(fake.summary_requests) == 3, len(fake.summary_requests)
    assert "3 summaries failed in a row; no more summary calls" in printed and agent.writer.breaker.failures == 3


def test_reactive_compaction_uses_the_summary_that_is_ready(s08, fake, make_agent):
    agent, gate, state = ahead_agent(make_agent), threading.Event(), {}
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), gate=gate))

    def step(body):
        """Small writes until a summary is asked for; its answer goes, and the next request is
        refused as too long, by about as much as the fake counts it (so the window is learned)."""
        n = len(fake.main_requests)
        if "ready" not in state and agent.ahead.job:  # started: its request is on its way
            wait_until(lambda: fake.summary_requests)
        if "ready" not in state and fake.summary_requests:
            gate.set()
            wait_until(lambda: agent.ahead.job and agent.ahead.job.done.is_set())
            state["ready"] = n
        if state.get("ready", n) < n and "refused" not in state:
            state["refused"] = True
            tokens = count_tokens(body)
            return error(400, "invalid_request_error", f"prompt is too long: {tokens} tokens > {tokens - 50} maximum")
        return text("Recovered.") if "refused" in state else write(n, size=1_000)

    fake.reply(*[step] * 60)
    assert s08.take_turn(agent, (messages := []), "write the files")
    assert "[reactive_compact]" in agent.out.text and "swapped in" in agent.out.text
    assert summaries_before(fake, fake.main_requests[-1]) == 1
    assert SUMMARY in json.dumps(fake.main_requests[-1]["messages"][0])
    assert_valid(messages)


def test_a_summary_that_failed_in_the_background_counts_and_the_fallback_stands_in(s08, fake, make_agent):
    agent = ahead_agent(make_agent)
    fake.summary(*[server_error() for _ in range(4)])  # the first try and three retries
    fake.reply(*[write(k) for k in range(20)], text("All written."))
    assert s08.take_turn(agent, (messages := []), "write the files")
    printed = agent.out.text
    assert "[summary] failed (1/3)" in printed and "summary by fallback" in printed
    assert agent.writer.breaker.failures == 1 and len(fake.summary_requests) >= 4
    assert "[summary ahead] it failed (500 " in printed and "swapped in" not in printed, \
        "a summary that failed is not said to be swapped in"
    assert "(Assembled without the model" in json.dumps(messages[0])
    assert_valid(messages)


def test_the_cheap_layers_shortening_the_snapshot_do_not_spoil_the_swap(s08, fake, make_agent, workspace):
    """Results cleared and a middle snipped inside the snapshot after it was taken: the swap
    still replaces exactly that part, and keeps the rest as it is."""
    agent = ahead_agent(make_agent)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"))
    messages = notes_read(40)
    start_now(s08, agent, messages)
    covered = agent.ahead.job.covered
    assert covered == len(messages)  # all of it: it ends with a complete call and its results
    wait_until(lambda: agent.ahead.job.done.is_set())
    messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": "new", "name": "read_file",
                                                    "input": {"path": "new.md"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "new", "content": "new"}]}]
    after = messages[covered:]
    shortened = s08.micro_compact(messages, keep_recent=1, min_chars=100, clear_at_least=0, store=agent.store)
    shortened = s08.snip_compact(shortened, keep_head=3, keep_tail=12, at_least=20, tools=s08.TOOLS, store=agent.store)
    assert len(shortened) < len(messages) and shortened[-4:] != after[-4:]  # both acted
    result = s08.compact_now(agent, shortened)
    assert SUMMARY in json.dumps(result[0]) and "swapped in" in agent.out.text
    assert result[1:] == shortened[-len(after):]  # what came after the snapshot, as the layers left it
    assert_valid(result)
    # a snip that reaches past the snapshot: the summary is set aside, not swapped in wrong
    start_now(s08, agent, messages[:covered])
    wait_until(lambda: agent.ahead.job.done.is_set())
    fake.summary(text("<summary>written at the threshold</summary>"))
    cut = messages[:3] + messages[-2:]
    result = s08.compact_now(agent, cut)
    assert "where its snapshot ended changed" in agent.out.text and "written at the threshold" in json.dumps(result[0])


def test_leaving_with_a_summary_in_flight_is_prompt_and_leaves_no_request_hanging(fake, workspace):
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), seconds=60))  # not let go in time

    def last(body):  # answered once the summary's request is in: the program leaves with it in flight
        wait_until(lambda: fake.summary_requests)
        return text("Ten written.")

    fake.reply(*[write(k) for k in range(10)], last)
    done = run_cli(fake, workspace, "write ten files\n", CONTEXT_WINDOW=WINDOW, SUMMARY_AHEAD="0.6-0.6")
    assert done.returncode == 0, done.stderr
    assert "[summary ahead] writing a summary of" in done.stdout and "Traceback" not in done.stderr
    wait_until(lambda: "client closed" in fake.stalls)


def test_resume_of_a_session_killed_while_a_summary_was_written(fake, workspace):
    fake.summary(held(text(f"<summary>{SUMMARY}</summary>"), seconds=60))  # not let go in time: it is killed waiting
    fake.reply(*[write(k) for k in range(20)], text("All written."))
    env = cli_env(fake, CONTEXT_WINDOW=WINDOW, SUMMARY_AHEAD="0.6-0.6")
    pid, folder = cli_runner.start([], input="write the files\n", env=env, cwd=workspace)
    wait_until(lambda: fake.summary_requests and len(fake.main_requests) >= 12, timeout=30)
    os.kill(pid, signal.SIGKILL)
    cli_runner.finish(pid, folder)
    fake.replies.clear()
    fake.reply(text("Resumed."))
    done = run_cli(fake, workspace, "what now?\n", args=["--resume"], CONTEXT_WINDOW=WINDOW, SUMMARY_AHEAD="off")
    assert done.returncode == 0, done.stderr
    resumed = fake.main_requests[-1]["messages"]
    assert SUMMARY not in json.dumps(resumed) and "what now?" in json.dumps(resumed[-1])
    assert_valid(resumed)


def test_settings_turn_it_off_and_move_the_threshold(s08, fake, workspace):
    fake.reply(*[write(k) for k in range(3)], text("Three written."))
    done = run_cli(fake, workspace, "write three\n/context\n", CONTEXT_WINDOW=WINDOW, SUMMARY_AHEAD="off",
                   COMPACT_AT="50%")
    assert done.returncode == 0, done.stderr
    assert "summary ahead: off" in done.stdout.lower() and "Auto-compact above 12.0k tokens (50% of the window" \
        in done.stdout
    assert not fake.summary_requests
    bad = run_cli(fake, workspace, "", SUMMARY_AHEAD="soon")
    assert bad.returncode == 2 and "SUMMARY_AHEAD='soon' must be off" in bad.stderr


def test_a_subagent_compacts_as_before_and_the_summary_in_flight_goes_on(s08, fake, make_agent):
    agent, messages, job = start_one_in_flight(s08, fake, make_agent)
    fake.reply(tool_use("task", {"prompt": "count the files", "description": "count"}), text("Six files."),
               text("The subagent counted six."))
    assert s08.take_turn(agent, messages, "ask a subagent to count the files")
    assert agent.ahead.job is job and job.thread.is_alive()  # untouched by the subagent's loop
    assert len(fake.summary_requests) == 1
    take_line(agent, messages, "/clear", s08.LESSON)
    called_off(fake, job)


def test_a_useless_summary_still_leaves_what_the_work_depends_on(s08, fake, make_agent):
    """With a summary that says nothing, every request after the swap still carries the
    user's rule from an earlier turn, the edited file, the todo list, the latest failed
    command's error output and the current request."""
    agent = ahead_agent(make_agent)
    fake.summary(text("<summary>ok</summary>"))
    fake.reply(text("Understood."),
               tool_use("todo_write", {"items": [{"content": "fix the frob link error", "status": "in_progress"}]}),
               tool_use("write_file", {"path": "src/app.c", "content": "int main(void) { return frob_v2(); }\n"}),
               tool_use("bash", {"command": "echo 'ld: error: undefined symbol: frob_v2' >&2; exit 2"}),
               *[write(k) for k in range(20)], text("Written."))
    messages = []
    assert s08.take_turn(agent, messages, "You must never use tabs in this project.")
    assert s08.take_turn(agent, messages, "build src/app.c, then write the out files")
    after = fake.main_requests[first_with(fake, "[Compacted"):]
    assert after and "swapped in" in agent.out.text
    for request in after:
        sent = json.dumps(request["messages"])
        for needed in ("You must never use tabs", "src/app.c", "fix the frob link error",
                       "undefined symbol: frob_v2", "build src/app.c, then write the out files"):
            assert needed in sent, (needed, fake.main_requests.index(request), json.loads(sent)[0])


def test_a_snip_that_took_the_first_reply_after_the_snapshot_keeps_its_note(s08, fake, make_agent):
    """The snip's note says where the newer messages it cut went; everything it kept after
    the note is newer than the snapshot and stays as it is."""
    agent = ahead_agent(make_agent)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"))
    messages = [{"role": "user", "content": [{"type": "text", "text": "read them all"}]}]

    for k in range(10):
        messages += read_pair(f"old{k}", "y" * 2_000)
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    for k in range(30):
        messages += read_pair(f"new{k}", "ok")
    snipped = s08.snip_compact(messages, keep_head=3, keep_tail=47, at_least=20, tools=s08.TOOLS, store=agent.store)
    assert "[Snipped" in json.dumps(snipped[2]) and '"new0"' not in json.dumps(snipped)  # it took the boundary
    result = s08.compact_now(agent, snipped)
    assert SUMMARY in json.dumps(result[0]) and "[Snipped" in json.dumps(result[0]) and "swapped in" in agent.out.text
    assert result[1:] == snipped[3:]  # every message the snip kept after its note, as it is
    assert_valid(result)
    # what the snip cut after the snapshot is read back by the next summary: nothing is lost
    fake.summary(text("<summary>the next one</summary>"))
    s08.compact_now(agent, result)
    assert "(call new0):" in json.dumps(fake.summary_requests[-1]["messages"])


def test_words_merged_into_the_snapshots_last_message_set_the_summary_aside(s08, fake, make_agent):
    """After a failed turn the next prompt joins the pending results, which the snapshot
    ended with: the summary never saw those words, so it is set aside and they stay."""
    from s08_context_compact.command_line.user_turns import add_user_text
    agent = ahead_agent(make_agent)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"), text("<summary>written at the threshold</summary>"))
    messages = notes_read(12)
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    assert add_user_text(messages, "and then fix the typo in n3.md")  # joined the results the snapshot ended with
    result = s08.compact_now(agent, messages)
    assert "where its snapshot ended changed" in agent.out.text and "swapped in" not in agent.out.text
    assert SUMMARY not in json.dumps(result) and "written at the threshold" in json.dumps(result[0])
    assert "fix the typo in n3.md" in json.dumps(result)
    assert_valid(result)


def test_the_early_mark_leaves_a_summary_the_steps_it_takes(s08, make_agent):
    """The mark, from what the session measured: as many whole steps before the threshold
    as the recent summaries took (their upper median), each as big as a big step."""
    from s08_context_compact.compaction.summary_ahead import SummaryAhead
    agent = ahead_agent(make_agent)
    threshold, shares = agent.settings.threshold, (0.5, 0.95)
    ahead = SummaryAhead()
    assert ahead.mark(threshold, shares) == int(threshold * 0.5)  # nothing measured: as early as allowed
    clock = 0.0
    for k in range(12):  # steps of 2 s adding 600 tokens; every other pass follows a pause for the user
        prompt = k % 2 == 0
        clock += 60.0 if prompt else 2.0
        ahead.passes.append((clock, 1_000 + 600 * k, not prompt))
    ahead.durations.extend([5.0, 7.5, 6.5])
    assert ahead.mark(threshold, shares) == threshold - 4 * 600  # 6.5 s is 3.25 steps: 4 whole ones
    ahead.durations.append(30.0)  # one slow summary: the upper median moves a little, not to 15 steps
    assert ahead.mark(threshold, shares) == threshold - 4 * 600
    ahead.durations.extend([40.0] * 3)  # summaries this slow start before the earliest share: 20 steps
    assert ahead.mark(threshold, shares) == threshold - 20 * 600
    ahead.durations.extend([80.0] * 4)  # slower than the steps fill the whole threshold: right after a compaction
    assert ahead.placed(threshold, shares) == (0, "right after a compaction: the steps add 24,000 tokens while a "
                                                  "summary is written, more than the threshold holds")
    agent.ahead, agent.settings = ahead, replace(agent.settings, summary_ahead=shares)
    assert "the next starts at 0 tokens: right after a compaction" in context_breakdown(s08, agent, [])  # and says why
    ahead.durations.extend([0.1] * 4)
    assert ahead.mark(threshold, shares) == int(threshold * 0.95)  # and never after the latest


def test_a_summary_written_ahead_is_paid_for_in_the_sessions_picture(s08, fake, make_agent):
    from s08_context_compact.command_line import session_picture
    agent = ahead_agent(make_agent)
    messages = open_session(agent, None)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"))
    fake.reply(*[write(k) for k in range(20)], text("All written."))
    assert s08.take_turn(agent, messages, "write the files")
    assert "swapped in" in agent.out.text  # (and the next one may be in flight: it is logged once it is over)
    logged = [line for line in agent.log.path.read_text().splitlines() if '"writing the summary ahead"' in line]
    paid = next(u for u in fake.usage_log if u["summary"])
    assert len(logged) == 1 and f'"cache_read_input_tokens": {paid["cache_read_input_tokens"]}' in logged[0]
    shown = session_picture.write_report(agent.log.path).read_text(encoding="utf-8")
    assert f"{len(fake.main_requests)} model calls and 1 summary calls" in shown


def test_a_summary_set_aside_is_in_the_sessions_picture_with_why(s08, fake, make_agent):
    from s08_context_compact.command_line import session_picture
    agent = ahead_agent(make_agent)
    messages = open_session(agent, None)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"))
    fake.reply(text("Read."))
    assert s08.take_turn(agent, messages, "read the notes")
    messages += notes_read(12)[1:]
    start_now(s08, agent, messages)
    ahead = agent.ahead  # /clear starts the loop's state anew
    wait_until(lambda: ahead.job.done.is_set())
    take_line(agent, messages, "/clear", s08.LESSON)
    assert ahead.discarded == 1 and "[summary ahead] set aside: /clear" in agent.out.text
    shown = session_picture.write_report(agent.log.path).read_text(encoding="utf-8")
    assert "writing the summary ahead (set aside: /clear)" in shown


def test_words_put_in_place_of_withdrawn_ones_are_not_taken_for_the_snapshots(s08, fake, make_agent):
    """The snapshot ended with results and a prompt merged into them; that prompt was taken
    back and another typed: same kinds of block, other words. The summary is set aside."""
    from s08_context_compact.command_line.user_turns import add_user_text
    agent = ahead_agent(make_agent)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"), text("<summary>written at the threshold</summary>"))
    messages = notes_read(12)
    add_user_text(messages, "P2: the words taken back")
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    messages[-1] = {**messages[-1], "content": messages[-1]["content"][:-1]}  # withdrawn, as a failed turn does
    add_user_text(messages, "P3: rename frob to frob_v2")
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "Renamed."}]})
    result = s08.compact_now(agent, messages)
    assert "where its snapshot ended changed" in agent.out.text and SUMMARY not in json.dumps(result)
    assert "P3: rename frob to frob_v2" in json.dumps(fake.summary_requests[-1])  # the summary written now saw it
    assert_valid(result)


@pytest.mark.parametrize("finished", [True, False], ids=["turn over", "turn going on"])
def test_a_snip_past_the_snapshot_keeps_the_request_it_put_back(s08, fake, make_agent, finished):
    """A snip that took the snapshot's end puts the current request back after its note; a
    swap that keeps only what came after the note keeps that request, once."""
    agent = ahead_agent(make_agent)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"))
    messages = [{"role": "user", "content": [{"type": "text", "text": "read them all"}]}]

    for k in range(3):
        messages += read_pair(f"old{k}", "y" * 2_000)
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    messages += [{"role": "assistant", "content": [{"type": "text", "text": "Done reading."}]},
                 {"role": "user", "content": [{"type": "text", "text": "NEW REQUEST: port the parser to Rust."}]}]
    for k in range(12):
        messages += read_pair(f"new{k}", "y" * 2_000)
    if finished:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Ported; the tests pass."}]})
    snipped = s08.snip_compact(messages, keep_head=3, keep_tail=10, at_least=4, tools=s08.TOOLS, store=agent.store)
    assert "NEW REQUEST" in json.dumps(snipped[2])  # the snip put it back after its note
    result = s08.compact_now(agent, snipped)
    assert "swapped in" in agent.out.text
    if finished:  # with the summary, whatever room the user's recent words get
        assert "NEW REQUEST: port the parser to Rust." in result[0]["content"][0]["text"]
    else:  # the request being worked on comes last, as after every summary, and only there
        assert json.dumps(result[0]).count("NEW REQUEST: port the parser") == 1
        assert result[0]["content"][-1]["text"] == "NEW REQUEST: port the parser to Rust."
    assert_valid(result)


def test_a_summary_ready_when_the_breaker_has_opened_is_paid_for_and_not_used(s08, fake, make_agent):
    """Asked for before three summaries failed in a row: its reply is not used (the breaker
    says no more model summaries), but what it cost is counted and logged."""
    agent = ahead_agent(make_agent)
    messages = open_session(agent, None)
    fake.summary(text(f"<summary>{SUMMARY}</summary>"))
    messages += notes_read(12)
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    agent.writer.breaker.failures = 3  # three failed meanwhile
    result = s08.compact_now(agent, messages)
    paid = next(u for u in fake.usage_log if u["summary"])
    assert SUMMARY not in json.dumps(result) and "summary by fallback" in agent.out.text
    assert agent.usage_totals.get("output_tokens", 0) >= paid["output_tokens"] > 0
    logged = agent.log.path.read_text()
    assert "writing the summary ahead (the breaker is open)" in logged


def test_a_summary_written_ahead_no_smaller_than_the_history_is_followed_by_one_written_now(
        s08, fake, make_agent):
    agent = make_agent(window=200_000)
    agent.settings = replace(agent.settings, summary_ahead=EARLY)
    wordy = "<summary>" + "The work so far, told in far too many words. " * 250 + "</summary>"
    fake.summary(text(wordy), text("<summary>Short and to the point.</summary>"))
    # longer than a short summary and what comes back after it, shorter than the wordy one
    padding = {"role": "assistant", "content": [{"type": "text", "text": "Noted; reading on. " * 200}]}
    messages = notes_read(1) + [padding, {"role": "user", "content": [{"type": "text", "text": "go on"}]}]
    messages += read_pair("r9", "z" * 2_500)  # the tail kept: its result previewed, saved after
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    result = s08.compact_now(agent, messages)
    assert re.search(r"no smaller than the history; the history is kept \(transcript saved to "
                     r"\.transcripts/compact-[^)]+\.jsonl\)", agent.out.text), "the transcript named, no other file"
    assert "Short and to the point." in json.dumps(result[0]) and len(fake.summary_requests) == 2
    assert_valid(result)


def test_a_summary_ahead_that_failed_says_so_at_the_next_pass_and_context_does_too(s08, fake, make_agent):
    """Over and failed: what its calls met is said at the next pass, not when it is taken at
    the threshold, and /context says it failed, not that one is ready."""
    agent = make_agent()
    agent.settings = replace(agent.settings, summary_ahead=EARLY)
    fake.summary(*[server_error() for _ in range(4)])  # the first try and three retries
    messages = notes_read(10)
    start_now(s08, agent, messages)
    wait_until(lambda: agent.ahead.job.done.is_set())
    before = len(agent.out)
    agent.ahead.due(messages, 0, agent.settings)  # the next pass
    assert "retrying" in "".join(agent.out[before:])
    handle_command(agent, messages, "/context", s08.LESSON)
    shown = "".join(agent.out[before:])
    assert "messages failed (500 " in shown and "one ready" not in shown
