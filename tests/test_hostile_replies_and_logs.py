"""What the endpoint or the model can send, and the program must survive: an emoji cut
into its two UTF-16 halves, a NUL in a path, a tool input nested thousands of levels deep
or bigger than the window. No traceback, no wedged session."""

import json

from conftest import assert_requests_valid, blocks, plain, run_cli
from fake_anthropic import broken_tool_json, split_surrogates, text, tool_use, tool_uses


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
    assert fake.rejections == [] and len(fake.requests) == 4, "no request refused, none repeated"
    call = blocks(fake.requests[-1]["messages"][1])[0]
    assert call["input"]["path"] == "big.txt" and str(parked.relative_to(workspace)) in call["input"]["content"]
    assert "Third answer." in done.stdout
