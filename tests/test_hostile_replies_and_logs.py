"""What the endpoint, the model or an old log can send, and the program must survive: an
emoji cut into its two UTF-16 halves, a NUL in a path, a tool input nested thousands of
levels deep or bigger than the window, a session log that breaks the API's rules, and two
programs resuming one session. No traceback, no wedged session."""

import json
import threading

import anthropic
import pytest

from conftest import assert_requests_valid, blocks, plain, run_cli
from s08_context_compact.offline.fake_anthropic import broken_tool_json, split_surrogates, text, tool_use, tool_uses
from s08_context_compact.session import log_checks  # noqa: E402
from s08_context_compact.command_line import open_session


def log_of(workspace):
    return next((workspace / ".transcripts").glob("session-*.jsonl"))


def results_in(request) -> dict:
    """tool_use_id -> the tool_result block, over every message of a request."""
    return {b["tool_use_id"]: b for m in request["messages"] for b in blocks(m) if b.get("type") == "tool_result"}


# ---------------------------------------------------------------- what the endpoint sends

def test_an_emoji_split_across_two_deltas_is_joined_and_a_lone_half_written_as_a_replacement(fake, workspace):
    fake.thinking = True  # the thinking must come back exactly as signed: its halves joined
    fake.reply(split_surrogates({"content": [
        {"type": "thinking", "thinking": "Think 😀 twice."}, {"type": "text", "text": "Writing 😀 now."},
        {"type": "tool_use", "id": "toolu_e", "name": "write_file", "input": {"path": "smile.txt", "content": "a 😀 b"}}]}),
        split_surrogates(text("A lone \ud800 half, then 🎉.")), text("Still here."))
    done = run_cli(fake, workspace, "smile\nnext\n/compact\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (workspace / "smile.txt").read_text(encoding="utf-8") == "a 😀 b"
    assert "Writing 😀 now." in done.stdout and "A lone \ufffd half, then 🎉." in done.stdout
    sent = json.dumps(plain(fake.main_requests[-1]["messages"]), ensure_ascii=False)
    assert "Writing 😀 now." in sent and "A lone \ufffd half, then 🎉." in sent and "Think 😀 twice." in sent
    assert_requests_valid(fake)  # with thinking on, the fake checked each signature
    for path in [log_of(workspace), *workspace.glob(".transcripts/compact-*.jsonl")]:
        records = [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]  # strict UTF-8
        assert "\ufffd half" in json.dumps(records, ensure_ascii=False), path


def test_a_nul_in_a_path_and_input_nested_too_deep_get_errors_the_model_can_act_on(fake, workspace):
    deep = {"items": [{"content": "x", "status": "pending"}]}
    for _ in range(200):
        deep = {"items": [deep]}
    fake.reply(tool_uses([("read_file", {"path": "a\0b.txt"}, "toolu_nul"),
                          ("glob", {"pattern": "*.py", "path": "src\0"}, "toolu_glob")]),
               broken_tool_json("bash", '{"command": ' + "[" * 5000 + "]" * 5000 + "}", id="toolu_deep"),
               tool_use("todo_write", deep, "toolu_deeper"), text("Understood."), text("Next turn works."))
    done = run_cli(fake, workspace, "go\nagain\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    results = results_in(fake.main_requests[-2])
    assert "'path' contains a NUL character" in results["toolu_nul"]["content"]
    assert "'path' contains a NUL character" in results["toolu_glob"]["content"]
    for call in ("toolu_deep", "toolu_deeper"):
        assert results[call]["is_error"] and "more than 64 levels deep" in results[call]["content"]
    assert "Next turn works." in done.stdout
    assert_requests_valid(fake)
    assert '"input": {}' in log_of(workspace).read_text(), "the history keeps an input every later request can carry"


def test_a_tool_input_bigger_than_the_window_is_parked_and_the_session_goes_on(fake, workspace):
    fake.context_window = 12_000
    content = "".join(f"line {n} of a file too big for the window\n" for n in range(4_000))
    fake.reply(tool_use("write_file", {"path": "big.txt", "content": content}, "toolu_big"),
               text("Wrote it."), text("Second answer."), text("Third answer."))
    done = run_cli(fake, workspace, "write it\nsecond\nthird\n", CONTEXT_WINDOW=12_000)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (workspace / "big.txt").read_text() == content, "the call ran with its whole input"
    parked = workspace / ".task_outputs" / "tool-results" / "toolu_big-content.txt"
    assert parked.read_text() == content and "[tool input]" in done.stdout
    # (a summary may be written in the background meanwhile: the conversation's requests are counted)
    assert fake.rejections == [] and len(fake.main_requests) == 4, "no request refused, none repeated"
    call = blocks(fake.main_requests[-1]["messages"][1])[0]
    assert call["input"]["path"] == "big.txt" and str(parked.relative_to(workspace)) in call["input"]["content"]
    assert "Third answer." in done.stdout


# ---------------------------------------------------------------- what a replayed log holds

MARK = {"type": "ephemeral"}


def broken_log() -> list:
    """A log edited by hand: each record breaks one of the API's rules, or the program's."""
    filler = [m for n in range(30) for m in (
        {"role": "user", "content": [{"type": "text", "text": f"question {n} " + "words " * 120}]},
        {"role": "assistant", "content": [{"type": "text", "text": f"answer {n} " + "words " * 120}]})]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "first question"}]},
        {"role": "assistant", "content": []},  # empty, and not the last
        {"role": "user", "content": [{"type": "text", "text": ""},  # empty text
                                     {"type": "text", "text": "[Snipped 3 messages]", "_s08": "snip", "snipped": "3"},
                                     {"type": "text", "text": "second question", "cache_control": MARK}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                           "input": {"command": "ls"}, "cache_control": MARK}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": 42,
                                      "cache_control": MARK}]},  # a number
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",  # the id again
                                           "input": {"command": "pwd"}}, {"type": "mystery", "data": 1}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "/ws",
                                      "cache_control": MARK}, {"type": "text", "text": "and?", "flavour": "odd"}]},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "go on", "cache_control": MARK}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A lone \ud800 half."}]},
    ] + filler
    return [{"type": "message", "message": m} for m in messages]


def test_a_resumed_log_that_breaks_the_apis_rules_is_repaired_and_said_in_one_line(fake, workspace):
    folder = workspace / ".transcripts"
    folder.mkdir()
    path = folder / "session-20260101-000000-abcdef.jsonl"
    chain = log_checks.Chain()  # signed as the program signs its lines: what it wrote, broken as a crash leaves it
    path.write_text("".join(chain.signed(json.dumps(r)) + "\n" for r in broken_log()))  # \ud800 escaped
    done = run_cli(fake, workspace, "continue\n", args=["--resume"], CONTEXT_WINDOW=12_000)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("[session log] repaired")]
    assert len(said) == 1, done.stdout
    for repair in ("dropped", "2 empty messages", "1 empty text block", "5 cache marks", "1 unknown field",
                   "1 unknown or misplaced block", "1 bad program marker", "renamed 1 reused tool_use id",
                   "turned 1 tool result into text"):
        assert repair in said[0], (repair, said[0])
    assert fake.rejections == [] and fake.main_requests, "the fake validated every request and took it"
    assert_requests_valid(fake)
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    repaired = next(r for r in records if r["type"] == "history")["messages"]  # what the first request started from
    ids = [b["id"] for m in repaired for b in blocks(m) if b.get("type") == "tool_use"]
    assert len(ids) == len(set(ids)) == 2 and results_in({"messages": repaired})["toolu_1"]["content"] == "42"
    assert "A lone \ufffd half." in json.dumps(repaired, ensure_ascii=False)
    assert any(r.get("layer") == "snip_compact" for r in records), "snip_compact ran over the repaired marker"
    assert "Done." in done.stdout


@pytest.mark.parametrize("messages, said", [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": []}, {"role": "user", "content": "b"}],
     "messages.1: all messages must have non-empty content except for the optional final assistant message"),
    ([{"role": "user", "content": [{"type": "text", "text": "a", "flavour": "odd"}]}],
     "messages.0.content.0.flavour: Extra inputs are not permitted"),
    ([{"role": "user", "content": [{"type": "mystery"}]}], "messages.0.content.0.type: Input tag 'mystery'"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "bash", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 42}]}],
     "messages.2.content.0.content: Input should be a valid string or list"),
])
def test_the_fake_refuses_what_a_broken_log_would_send(fake, messages, said):
    client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=10, messages=messages)
    assert caught.value.body["error"]["message"].startswith(said)


def test_a_session_open_in_one_program_is_refused_to_a_second(s08, fake, make_agent, workspace):
    fake.reply(text("First."), text("From the first program."), text("After it ended."))
    assert run_cli(fake, workspace, "hello\n").returncode == 0
    path = log_of(workspace)
    holder = make_agent()
    history = open_session(holder, path)  # the first program resumes the session and keeps it open
    before = path.read_bytes()
    second = run_cli(fake, workspace, "me too\n", args=["--resume"])
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert "is open in another program" in second.stderr and "without --resume" in second.stderr
    assert path.read_bytes() == before, "the second program wrote nothing into the log"
    s08.take_turn(holder, history, "still mine")
    holder.log.close()  # the first program ends
    third = run_cli(fake, workspace, "now me\n", args=["--resume"])
    assert third.returncode == 0 and "Resumed session" in third.stdout
    assert [m["content"][-1]["text"] for m in plain(fake.requests[-1]["messages"])] == [
        "hello", "First.", "still mine", "From the first program.", "now me"]


def test_programs_starting_together_all_sign_with_one_whole_key(tmp_path, monkeypatch):
    """The key is never read half written, and never made twice: a program that started at
    the same moment as the one making it would otherwise sign nothing, or sign with a key
    the other replaced, and its log could never be resumed. Whether the key is missing or
    was left empty by a crash, they all keep the one key made."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "fresh"))
    made = []
    for _ in ("missing", "emptied"):
        start, keys = threading.Barrier(8), []

        def one_program():
            start.wait()
            keys.append(log_checks.log_key(create=True))

        threads = [threading.Thread(target=one_program) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(keys)) == 1 and len(keys[0][0]) == 32 and keys[0][1] == ""
        assert bytes.fromhex(log_checks.key_file().read_text()) == keys[0][0]
        made.append(keys[0][0])
        log_checks.key_file().write_text("")  # an empty key file is no key, not an empty one
        said = f"the log key {log_checks.key_file()} is empty or damaged"
        assert log_checks.log_key(create=False) == (None, said)
    assert made[0] != made[1] and log_checks.key_file().stat().st_mode & 0o777 == 0o600
    left = sorted(p.name for p in log_checks.key_file().parent.iterdir())
    assert left == [".log-key.lock", "log-key"], "no key written aside is left behind"
