"""Never lose a session: the session log, resume, faults, and hostile input."""

import json
import signal
import time
import tracemalloc

import pytest

from conftest import LiveCLI, assert_requests_valid, assert_valid, blocks, plain, run_cli, user, use_tool
from s08_context_compact.offline.fake_anthropic import text, tool_use, tool_uses
from s08_context_compact.session import session_log  # noqa: E402
from s08_context_compact.command_line import open_session
from s08_context_compact.messages import replace_history


def logged_agent(s08, make_agent, workspace, **kw):
    agent = make_agent(**kw)
    agent.log = session_log.SessionLog(workspace / ".transcripts" / "session-test.jsonl")
    return agent


# ---------------------------------------------------------------- the session log

def test_every_message_and_rewrite_is_logged_as_it_happens(s08, fake, make_agent, workspace):
    (workspace / "a.txt").write_text("alpha\n" * 50)
    agent = logged_agent(s08, make_agent, workspace)
    fake.reply(tool_use("read_file", {"path": "a.txt"}), text("Read."), tool_use("bash", {"command": "echo x"}),
               text("Ran."))
    messages = []
    s08.take_turn(agent, messages, "read a.txt")
    assert session_log.read_session(agent.log.path) == messages
    s08.take_turn(agent, messages, "run it")
    replace_history(agent.log, messages, s08.compact_now(agent, messages), "/compact")
    assert session_log.read_session(agent.log.path) == messages
    records = [json.loads(line) for line in agent.log.path.read_text().splitlines()]
    rewrites = [r for r in records if r["type"] == "rewrite"]
    assert len(rewrites) == 1 and [list(p) for p in rewrites[0]["parts"]] == [["message"]], \
        "a summary at the end of a turn leaves one new message, and the log holds only it"
    assert rewrites[0]["parts"][0]["message"] == messages[0]


def test_resume_starts_from_the_endpoints_count_and_estimates_nothing(s08, fake, make_agent, workspace):
    agent = logged_agent(s08, make_agent, workspace)
    fake.reply(text("First answer. " * 50), text("Second answer. " * 50))
    messages = []
    s08.take_turn(agent, messages, "hello")
    s08.take_turn(agent, messages, "and again")
    counted = agent.state.counter.anchor_tokens
    assert counted and counted == fake.usage_log[-1]["input_tokens"] + fake.usage_log[-1]["cache_read_input_tokens"] \
        + fake.usage_log[-1]["cache_creation_input_tokens"] + fake.usage_log[-1]["output_tokens"]
    agent.log.close()  # the session ends: its log is no longer held
    for _ in range(2):  # a resume of a resumed session too
        resumed = make_agent()
        history = open_session(resumed, agent.log.path)
        assert history == messages
        assert s08.context_tokens(resumed, history) == counted
        assert resumed.state.counter.sizes == {}, "the first pass after --resume estimated no message"
        resumed.log.close()


def test_a_torn_last_line_is_skipped(s08, fake, make_agent, workspace):
    agent = logged_agent(s08, make_agent, workspace)
    messages = []
    s08.take_turn(agent, messages, "hello")
    with open(agent.log.path, "a") as f:
        f.write('{"type": "message", "message": {"role": "user", "cont')
    assert session_log.read_session(agent.log.path) == messages


def test_list_and_resume_continue_exactly_where_the_model_was(fake, workspace):
    fake.reply(text("Hi there."), text("Second answer."))
    first = run_cli(fake, workspace, "hello\n")
    assert first.returncode == 0
    listing = run_cli(None, workspace, "", args=["--list"])
    assert listing.returncode == 0 and "2 messages" in listing.stdout and "hello" in listing.stdout
    resumed = run_cli(fake, workspace, "again\n", args=["--resume"])
    assert resumed.returncode == 0 and "Resumed session" in resumed.stdout
    assert plain(fake.requests[-1]["messages"]) == [
        user("hello"), {"role": "assistant", "content": [{"type": "text", "text": "Hi there."}]}, user("again")]
    missing = run_cli(fake, workspace, "", args=["--resume", "nope"])
    assert missing.returncode == 2 and "--list" in missing.stderr and "Traceback" not in missing.stderr
    session_id = next((workspace / ".transcripts").glob("session-*.jsonl")).stem.removeprefix("session-")
    fake.reply(text("Third answer."))
    by_prefix = run_cli(fake, workspace, "once more\n", args=("--resume", session_id[:12]))
    assert by_prefix.returncode == 0 and f"Resumed session {session_id}" in by_prefix.stdout, "a unique prefix will do"


def test_resume_in_a_folder_with_no_sessions_says_how_to_start(fake, workspace):
    done = run_cli(fake, workspace, "", args=("--resume",))
    assert done.returncode == 2 and "No sessions in" in done.stderr and "without --resume" in done.stderr


def test_resume_after_a_hard_kill_in_the_middle_of_a_tool(fake, workspace):
    fake.reply(tool_use("bash", {"command": "touch started; sleep 30"}, "toolu_slow"), text("Recovered."))
    cli = LiveCLI(fake, workspace)
    cli.type("run it\n")
    cli.wait_for(lambda: (workspace / "started").exists())
    cli.proc.kill()
    cli.proc.wait(timeout=10)
    resumed = run_cli(fake, workspace, "what happened?\n", args=["--resume"])
    assert resumed.returncode == 0, resumed.stderr
    sent = plain(fake.requests[-1]["messages"])
    assert sent[-1]["content"][0]["tool_use_id"] == "toolu_slow" and "stopped" in sent[-1]["content"][0]["content"]
    assert sent[-1]["content"][1] == {"type": "text", "text": "what happened?"}
    assert_requests_valid(fake)


def test_every_tool_output_can_be_rebuilt_byte_for_byte_from_the_log(fake, workspace):
    contents = {"small.txt": "tiny\n", "中文.md": "压缩上下文\n" * 300, "big.log": "".join(f"row {n}\n" for n in range(20_000))}
    for name, body in contents.items():
        (workspace / name).write_text(body)
    fake.reply(tool_uses([("bash", {"command": f"cat {name}"}, f"toolu_{n}") for n, name in enumerate(contents)]),
               text("Seen."))
    done = run_cli(fake, workspace, "show them\n/compact\n", CONTEXT_WINDOW=30_000)
    assert done.returncode == 0
    log = next((workspace / ".transcripts").glob("session-*.jsonl"))
    results = {b["tool_use_id"]: b["content"] for line in log.read_text().splitlines()
               for r in [json.loads(line)] if r["type"] == "message"
               for b in blocks(r["message"]) if b.get("type") == "tool_result"}
    for n, body in enumerate(contents.values()):
        assert results[f"toolu_{n}"] == body.rstrip("\n")
    saved = workspace / ".task_outputs" / "tool-results" / "toolu_2.txt"
    assert saved.read_bytes() == results["toolu_2"].encode()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # the log keeps the program's own fields on its blocks; requests carry them stripped
    logged = [json.dumps(plain(r["message"]), sort_keys=True) for r in records if r["type"] in ("message", "replace_last")]
    logged += [json.dumps(plain(p["message"]), sort_keys=True) for r in records if r["type"] == "rewrite"
               for p in r["parts"] if isinstance(p, dict)]
    for request in fake.valid_requests:  # every message ever sent can be found in the log
        for message in plain(request["messages"]):
            assert json.dumps(message, sort_keys=True) in logged or message["role"] == "user" and \
                message["content"][-1]["text"].startswith("TEXT ONLY"), message
    acted = [r for r in records if r["type"] == "layer"]  # each layer that acted, before the rewrite it caused
    assert {r["layer"] for r in acted} >= {"tool_result_budget", "compact_history"}
    assert any(r["saved_to"] == [".task_outputs/tool-results/"] for r in acted)
    assert any(r["saved_to"][0].startswith(".transcripts/compact-") for r in acted if r["layer"] == "compact_history")


def test_secrets_never_reach_the_model_or_the_disk(fake, workspace):
    secret = "sk-ant-very-secret-0123456789"
    fake.reply(tool_use("bash", {"command": "echo token=$MY_SERVICE_TOKEN; echo key=$ANTHROPIC_API_KEY; seq 3000"}),
               text("Done."))  # enough output that /compact has something to summarize
    done = run_cli(fake, workspace, f"never print {secret} again, run it\n/compact\n",
                   ANTHROPIC_API_KEY=secret, MY_SERVICE_TOKEN="hunter2hunter2")
    assert done.returncode == 0
    sent = json.dumps(fake.requests)
    assert secret not in sent and "hunter2hunter2" not in sent
    assert "token=\\nkey=" in sent, "bash does not inherit variables that hold secrets"
    assert "[redacted]" in sent, "the secret typed in the prompt is redacted"
    assert fake.summary_requests and list(workspace.glob(".transcripts/compact-*.jsonl"))
    for path in workspace.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret.encode() not in data and b"hunter2hunter2" not in data, path


# ---------------------------------------------------------------- faults

def test_ctrl_c_during_a_streamed_reply_keeps_the_history_valid(fake, workspace):
    fake.reply(dict(text("word " * 400), chunk_delay=0.02), text("Second reply."))
    cli = LiveCLI(fake, workspace)
    cli.type("talk\n")
    cli.wait_for(lambda: "word" in cli.output)  # the reply is streaming
    cli.proc.send_signal(signal.SIGINT)
    assert cli.finish("again\n") == 0
    sent = plain(fake.requests[-1]["messages"])
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    kept = sent[1]["content"][0]["text"]
    assert kept.startswith("word word") and kept.endswith("Do not resume it unless the user asks.]"), \
        "what the user saw stream stays, marked as interrupted"
    assert sent[2]["content"] == [{"type": "text", "text": "again"}]


def test_two_ctrl_c_at_the_prompt_exit_cleanly(fake, workspace):
    cli = LiveCLI(fake, workspace)
    cli.type("/help\n")
    cli.wait_for(lambda: "/context" in cli.output)
    cli.wait_at_prompt()
    cli.proc.send_signal(signal.SIGINT)
    cli.wait_for(lambda: "press Ctrl-C again" in cli.output)
    cli.wait_at_prompt()
    cli.proc.send_signal(signal.SIGINT)
    assert cli.proc.wait(timeout=10) == 0
    assert "Traceback" not in cli.proc.stderr.read()


def test_unwritable_output_folders_are_reported_once_and_the_session_goes_on(fake, workspace):
    (workspace / ".transcripts").write_text("not a folder")
    (workspace / ".task_outputs").write_text("not a folder")
    (workspace / "big.txt").write_text("x\n" * 60_000)
    fake.reply(tool_use("bash", {"command": "cat big.txt"}), text("Seen."), text("Still here."))
    done = run_cli(fake, workspace, "show big.txt\nanything else?\n/compact\n", CONTEXT_WINDOW=60_000)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "summary came out no smaller" not in done.stdout, "/compact could not save a transcript: nothing removed"
    assert done.stdout.count("cannot save to disk") == 1 and done.stdout.count("will not be resumable") == 1
    assert "Still here." in done.stdout
    second = fake.main_requests[1]["messages"][-1]["content"][0]["content"]
    assert len(second) > 100_000, "nothing was replaced by a pointer to a file that does not exist"


def test_a_prompt_too_big_for_the_window_is_saved_and_referenced(s08, fake, make_agent, workspace):
    agent = make_agent(window=12_000)
    huge = "please review this log: " + "error line\n" * 3_000
    messages = []
    s08.take_turn(agent, messages, huge)
    sent = plain(fake.requests[0]["messages"])[0]["content"][0]["text"]
    assert sent.startswith("My message is too long to send whole") and len(sent) < 500
    path = workspace / sent.split("saved at ")[1].split(":")[0]
    assert path.read_text() == huge
    assert fake.rejections == []


def test_a_tool_call_cut_off_by_max_tokens_is_not_run(s08, fake, make_agent, workspace):
    fake.reply({"content": [{"type": "tool_use", "id": "toolu_ok", "name": "bash", "input": {"command": "echo fine"}},
                            {"type": "tool_use", "id": "toolu_cut", "name": "write_file",
                             "input": {"path": "half.py", "content": "def f("}}],
                "stop_reason": "max_tokens"},
               text("Finished in smaller pieces."))
    agent = make_agent()
    messages = [user("write the module")]
    assert s08.agent_loop(agent, messages) == "Finished in smaller pieces."
    assert not (workspace / "half.py").exists()
    assistant, results = plain(fake.main_requests[1]["messages"])[1:3]
    assert [b["id"] for b in assistant["content"]] == ["toolu_ok"]
    assert results["content"][0]["tool_use_id"] == "toolu_ok"
    assert "output limit" in results["content"][1]["text"] and "write_file" in results["content"][1]["text"]
    assert_requests_valid(fake)
    assert_valid(messages, "write the module")


def test_a_cut_reply_with_no_complete_call_asks_the_model_to_go_on(s08, fake, make_agent):
    fake.reply({"content": [{"type": "tool_use", "id": "toolu_cut", "name": "bash", "input": {}}],
                "stop_reason": "max_tokens"}, text("Done now."))
    messages = [user("go")]
    assert s08.agent_loop(make_agent(), messages) == "Done now."
    assert plain(fake.main_requests[1]["messages"])[1]["content"] == [{"type": "text", "text": "(reply cut off)"}]
    assert_requests_valid(fake)


def test_duplicate_tool_use_ids_are_made_unique(s08, fake, make_agent):
    fake.reply(tool_uses([("bash", {"command": "echo one"}, "toolu_same"), ("bash", {"command": "echo two"}, "toolu_same")]),
               tool_use("bash", {"command": "echo three"}, "toolu_same"), text("ok"))
    messages = [user("go")]
    s08.agent_loop(make_agent(), messages)
    assert fake.rejections == []
    ids = [b["id"] for m in messages if m["role"] == "assistant" for b in m["content"] if b.get("type") == "tool_use"]
    assert len(ids) == len(set(ids)) == 3
    assert_valid(messages, "go")


# ---------------------------------------------------------------- hostile and odd input

def call(s08, agent, tool, **args):
    result = use_tool(s08, agent, {"type": "tool_use", "id": "toolu_h", "name": tool, "input": args})
    return result["content"], result.get("is_error", False)


def test_a_1gb_file_is_refused_quickly(s08, make_agent, workspace):
    with open(workspace / "disk.img", "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GB of zeros that takes no space
    started = time.monotonic()
    out, failed = call(s08, make_agent(), "read_file", path="disk.img")
    assert failed and "binary file (1,073,741,824 bytes)" in out and time.monotonic() - started < 2


def test_a_huge_single_line_file_is_read_within_limits(s08, make_agent, workspace):
    (workspace / "one.min.js").write_text("x" * 30_000_000 + "\nsecond line\n")
    tracemalloc.start()
    out, failed = call(s08, make_agent(), "read_file", path="one.min.js")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not failed and "line cut at 2000 chars" in out and "second line" in out
    assert peak < 20_000_000, f"peak memory {peak:,} bytes"


def test_edit_refuses_files_too_big_to_load(s08, make_agent, workspace):
    (workspace / "huge.txt").write_text("a" * 11_000_000)
    out, failed = call(s08, make_agent(), "edit_file", path="huge.txt", old_text="a", new_text="b")
    assert failed and "too big for edit_file" in out


def test_a_command_that_prints_without_end_is_stopped(s08, make_agent):
    started = time.monotonic()
    out, _ = call(s08, make_agent(), "bash", command="yes", timeout=2)
    assert time.monotonic() - started < 8
    assert "timed out after 2s" in out and len(out) < 250_000


def test_a_command_that_leaves_a_child_behind_does_not_block(s08, make_agent):
    started = time.monotonic()
    out, _ = call(s08, make_agent(), "bash", command="sleep 30 & echo started")
    assert out.startswith("started") and time.monotonic() - started < 5


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../outside.txt"])
def test_paths_leaving_the_workspace_are_refused(s08, make_agent, path):
    out, failed = call(s08, make_agent(), "read_file", path=path)
    assert failed and "outside the workspace" in out


def test_a_line_separator_inside_a_message_does_not_split_its_record(s08, tmp_path):
    message = {"role": "user", "content": [{"type": "text", "text": "one\u2028two\u2029three\x1cfour"}]}
    log = session_log.SessionLog(tmp_path / "session-x.jsonl")
    log.message(message, prompt=message["content"][0]["text"])
    warnings = []
    assert session_log.read_session(log.path, warn=warnings.append) == [message] and warnings == []
    assert session_log.first_prompt(log.path) == message["content"][0]["text"]
