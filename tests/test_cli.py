"""code.py as a user runs it: a subprocess with piped stdin, talking to the fake API."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import (CODE, RUN, LiveCLI, Terminal, assert_requests_valid, blocks, cli_env, plain, processes_with,
                      run_cli, wait_until)
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, text, tool_use, tool_uses
from s08_context_compact.messages import current_request


def test_import_without_api_key(tmp_path):
    script = ("import importlib, sys\n"
              f"sys.path.insert(0, {str(CODE.parent.parent)!r})\n"  # the program, as a package
              "m = importlib.import_module('s08_context_compact.code')\n"
              "print(len(m.TOOLS), list(m.TOOLS))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("9 ['bash', 'read_file', 'write_file', 'edit_file', 'glob', 'todo_write', "
                                  "'task', 'load_skill', 'compact']")


@pytest.mark.parametrize("missing, said", [
    ("ANTHROPIC_API_KEY", "Neither ANTHROPIC_API_KEY nor ANTHROPIC_AUTH_TOKEN is set."),
    ("MODEL_ID", "MODEL_ID is not set.")])
def test_missing_configuration_exits_2_with_a_pointer_to_env_example(workspace, missing, said):
    done = run_cli(None, workspace, "hello\n", **{missing: ""})
    assert done.returncode == 2
    assert said in done.stderr and ".env.example" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_a_reader_that_goes_away_ends_the_program_quietly(fake, workspace):
    # `python code.py | head -1`: after the first line nobody reads the output any more
    proc = subprocess.Popen([sys.executable, str(RUN)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=workspace, env=cli_env(fake))
    proc.stdin.write(b"/help\n" * 500)
    proc.stdin.close()
    assert proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=30) == 141, "128 + SIGPIPE, as a shell command would"
    assert proc.stderr.read() == b"", "no traceback, nothing at all on stderr"


def test_piped_input_exits_1_when_a_turn_ended_in_an_api_error(fake, workspace):
    fake.reply(error(401, "authentication_error", "invalid x-api-key"), text("fine"))
    failed = run_cli(fake, workspace, "hello\nagain\n")
    assert failed.returncode == 1 and "authentication_error" in failed.stdout and "Traceback" not in failed.stderr
    assert "fine" in failed.stdout, "the session went on after the error"
    fake.reply(text("all good"))
    assert run_cli(fake, workspace, "hello\n").returncode == 0


def test_bad_context_window_exits_2(fake, workspace):
    done = run_cli(fake, workspace, "", CONTEXT_WINDOW="lots")
    assert done.returncode == 2 and "CONTEXT_WINDOW='lots'" in done.stderr and "Traceback" not in done.stderr


def test_cache_ttl_1h_marks_every_breakpoint_for_an_hour(fake, workspace):
    fake.reply(text("one"), text("two"))
    done = run_cli(fake, workspace, "hello\nagain\n", CACHE_TTL="1h")
    assert done.returncode == 0, done.stderr
    marks = [b["cache_control"] for r in fake.requests for b in r["tools"] + [b for m in r["messages"]
             for b in m["content"]] if "cache_control" in b]
    assert marks and all(mark == {"type": "ephemeral", "ttl": "1h"} for mark in marks)
    assert fake.usage_log[-1]["cache_creation"]["ephemeral_1h_input_tokens"] >= 0
    bad = run_cli(fake, workspace, "", CACHE_TTL="2h")
    assert bad.returncode == 2 and "CACHE_TTL='2h' must be 5m or 1h" in bad.stderr and "Traceback" not in bad.stderr


def test_configuration_is_read_from_a_dotenv_file_in_the_working_directory(fake, workspace):
    (workspace / ".env").write_text(f"ANTHROPIC_API_KEY=from-dotenv\nMODEL_ID=claude-dotenv\n"
                                    f"ANTHROPIC_BASE_URL={fake.url}\nCONTEXT_WINDOW=50000\n")
    env = cli_env(fake)
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        env.pop(name)
    env["MODEL_ID"] = ""  # set but empty in the shell (`MODEL_ID= python ...`) is not set: .env's value is used
    done = subprocess.run([sys.executable, str(RUN)], input="hi\n/context\n", text=True, capture_output=True,
                          cwd=workspace, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert fake.requests[0]["model"] == "claude-dotenv" and "50,000-token window" in done.stdout


@pytest.mark.parametrize("ending", ["q\n", "exit\n", "quit\n", ""])
def test_the_repl_ends_with_exit_code_0(fake, workspace, ending):
    done = run_cli(fake, workspace, "hello\n" + ending + "never sent\n" * (ending != ""))
    assert done.returncode == 0, done.stderr
    assert len(fake.requests) == 1 and "Done." in done.stdout


def test_window_comes_from_the_models_api_when_not_configured(workspace):
    with FakeAnthropic(max_input_tokens=64_000) as fake:
        done = run_cli(fake, workspace, "/context\n")
    assert fake.model_lookups == ["claude-test"]
    assert "64,000-token window" in done.stdout


def test_window_falls_back_to_200k_when_the_models_api_does_not_answer(fake, workspace):
    done = run_cli(fake, workspace, "/context\n")
    assert fake.model_lookups == ["claude-test"] and "200,000-token window" in done.stdout


def test_piped_input_answers_permission_questions_with_no(fake, workspace):
    (workspace / "notes.txt").write_text("precious")
    fake.reply(tool_use("bash", {"command": "rm notes.txt"}, "toolu_rm"), text("Could not delete it."))
    done = run_cli(fake, workspace, "delete notes.txt\n", timeout=30)
    assert done.returncode == 0 and (workspace / "notes.txt").read_text() == "precious"
    result = fake.main_requests[1]["messages"][-1]["content"][0]
    assert result["is_error"] and "no one could confirm it (standard input is not a terminal)" in result["content"]
    assert "no one could confirm it (standard input is not a terminal)" in done.stdout, "piped, the reason shows whole"


def test_context_command_shows_sizes_and_threshold(fake, workspace):
    fake.reply(tool_use("bash", {"command": "seq 1 500"}), text("Counted."))
    done = run_cli(fake, workspace, "count\n/context\n", CONTEXT_WINDOW=30_000)
    report = done.stdout[done.stdout.index("Context:"):]
    assert "Context: 4 messages" in report and "of a 30,000-token window" in report
    total = int(re.search(r"Context: 4 messages, ([\d,]+) tokens", report).group(1).replace(",", ""))
    rows = dict(re.findall(r"^  (\w[\w +:-]+?) +([\d,]+)  [█░]{20} +\d+%$", report, re.M))
    sizes = {name: int(n.replace(",", "")) for name, n in rows.items()}
    assert list(sizes)[:5] == ["system prompt + tools", "user text", "assistant text", "tool calls", "tool results"]
    assert sum(list(sizes.values())[:5]) == total, "the parts add up to the total"
    assert sum(sizes.values()) == 30_000, "with what is free and what is reserved, to the window"
    assert sizes["free until auto-compact"] == 19_500 - total
    assert "tool results" in report and "Auto-compact above 19.5k tokens" in report
    assert "Saved so far:\n  tool_result_budget     0×  −0\n  snip_compact           0×  −0\n" in report
    assert "Prompt cache, last request: " in report and "Session input: " in report


def test_every_layer_fires_in_one_session_at_a_small_window(s08, workspace):
    """The chapter's promise, end to end: each layer acts, and nothing sent is ever invalid."""
    (workspace / "big.txt").write_text("big line\n" * 3_000)
    for n in range(6):
        (workspace / f"doc{n}.md").write_text(f"# doc {n}\n" + ("words " * 12 + "\n") * 45)
    with FakeAnthropic(context_window=12_000) as fake:
        fake.reply(tool_use("bash", {"command": "cat big.txt"}), text("That file is big."))          # budget
        fake.reply(*[tool_use("read_file", {"path": f"doc{n}.md"}) for n in range(6)], text("Read."))  # micro
        fake.reply(*[tool_use("bash", {"command": f"echo step {n}; seq 1 100"}) for n in range(26)],
                   text("Stepped."))                                                   # snip, once tokens call for it
        fake.reply(text("Compacted and ready."))
        fake.reply(*[text(f"Explanation {n}: " + "detail " * 1_400) for n in range(4)])            # auto summary
        fake.reply(error(400, "invalid_request_error", "prompt is too long: 13000 tokens > 12000 maximum"),
                   text("Recovered."))                                                           # reactive
        prompts = ["show big.txt", "read the docs", "run the steps", "/compact keep the file names", "hello",
                   "explain 1", "explain 2", "explain 3", "explain 4", "one more", "/context"]
        done = run_cli(fake, workspace, "\n".join(prompts) + "\n", timeout=90, CONTEXT_WINDOW=12_000)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    for layer in ("tool_result_budget", "snip_compact", "micro_compact", "compact_history", "reactive_compact"):
        assert f"[{layer}] " in out, f"{layer} did not fire:\n{out}"
    instructions = [blocks(r["messages"][-1])[-1]["text"] for r in fake.summary_requests]
    assert any("keep the file names" in i for i in instructions)
    assert not fake.invalid and not fake.overflows, "the only refusal is the scripted one"
    assert_requests_valid(fake)
    assert "Recovered." in out and "Traceback" not in done.stderr
    assert any((workspace / ".task_outputs" / "tool-results").iterdir())
    for transcript in (workspace / ".transcripts").glob("[!s]*"):  # the session log has tests of its own
        for line in transcript.read_text().splitlines():
            record = json.loads(line)
            assert record.get("role") in ("user", "assistant") or record["type"] == "compaction"
    # Every request carries the prompt being worked on, verbatim, as its newest user text
    # (the program's notes after it say they are none: "[Program note: ..."); the prompts come
    # in the order typed, and each one is worked on.
    typed = [p for p in prompts if not p.startswith("/")]
    current = [current_request([{**m, "content": [b for b in blocks(m) if not b.get("text", "").startswith("[Program note")]}
                                for m in plain(body["messages"])])["text"] for body in fake.main_requests]
    assert all(text in typed for text in current), [t[:60] for t in current if t not in typed]
    order = [typed.index(text) for text in current]
    assert order == sorted(order) and set(order) == set(range(len(typed))), order


def test_ctrl_c_during_a_model_call_returns_to_the_prompt(fake, workspace):
    fake.reply(dict(text("too late"), delay=5), text("second answer"))
    cli = LiveCLI(fake, workspace)
    cli.type("first\n")
    cli.wait_for(lambda: len(fake.requests) == 1)  # the fake holds its reply back for 5 s
    cli.proc.send_signal(signal.SIGINT)
    assert cli.finish("second\n") == 0
    assert "interrupted" in cli.output and "second answer" in cli.output
    assert "Traceback" not in cli.proc.stderr.read()
    sent = plain(fake.requests[-1]["messages"])
    assert [m["role"] for m in sent] == ["user", "assistant", "user"], "the next prompt is its own message"
    assert sent[0]["content"] == [{"type": "text", "text": "first"}]
    assert sent[1]["content"][0]["text"].startswith("[Interrupted by the user: this request was cancelled.")
    assert sent[2]["content"] == [{"type": "text", "text": "second"}]


def test_ctrl_c_during_a_tool_run_answers_the_call_as_interrupted(fake, workspace):
    fake.reply(tool_uses([("bash", {"command": "touch started; sleep 30"}, "toolu_slow"),
                          ("bash", {"command": "echo never"}, "toolu_next")]), text("ok, stopped"))
    cli = LiveCLI(fake, workspace)
    cli.type("run the slow thing\n")
    cli.wait_for(lambda: (workspace / "started").exists())
    cli.proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    assert cli.finish("what happened?\n") == 0
    assert time.monotonic() - started < 10, "the sleep was not killed"
    last = fake.main_requests[-1]["messages"]
    results = plain(last[-3]["content"])
    assert [b.get("tool_use_id") for b in results[:2]] == ["toolu_slow", "toolu_next"]
    assert all(b["is_error"] and "Interrupted" in b["content"] for b in results[:2])
    assert "this request was cancelled" in last[-2]["content"][0]["text"], "the model is told the work was cancelled"
    assert plain(last[-1]["content"]) == [{"type": "text", "text": "what happened?"}]
    assert_requests_valid(fake)


def test_ctrl_c_during_a_command_says_what_it_ended_and_goes_on(fake, workspace, marker):
    """Ctrl-C while bash runs: the command and what it started end, the user is told so,
    and the session goes on (on Python 3.10, which has no add_note, this once ended the
    program with a traceback)."""
    fake.reply(tool_use("bash", {"command": f"sleep 60.{marker}; echo never"}), text("ok, stopped"))
    cli = LiveCLI(fake, workspace)
    cli.type("wait\n")
    wait_until(lambda: processes_with(f"sleep\0" f"60.{marker}\0", exactly=True))  # bash has started it
    cli.proc.send_signal(signal.SIGINT)
    assert cli.finish("what happened?\n") == 0
    assert "Traceback" not in cli.proc.stderr.read()
    assert not processes_with(marker)
    assert f"The running command (sleep 60.{marker}; echo never) and the 1 process it started were ended." \
        in cli.output
    assert "(interrupted; the conversation is kept" in cli.output and "ok, stopped" in cli.output


def test_outputs_are_written_inside_the_working_directory(fake, workspace):
    (workspace / "huge.txt").write_text(("h" * 99 + "\n") * 1_200)
    fake.reply(tool_use("read_file", {"path": "huge.txt"}, "toolu_huge"), text("ok " * 4_000))
    run_cli(fake, workspace, "read it\n/compact\n", CONTEXT_WINDOW=30_000)
    assert (workspace / ".task_outputs" / "tool-results" / "toolu_huge.txt").exists()
    assert list((workspace / ".transcripts").glob("compact-*.jsonl"))


def test_input_that_is_not_utf8_is_read_not_fatal(fake, workspace):
    done = subprocess.run([sys.executable, str(RUN)], input=b"caf\xe9 \xff please\n", capture_output=True,
                          cwd=workspace, env=cli_env(fake), timeout=60)
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert fake.requests[0]["messages"][0]["content"][0]["text"] == "caf\ufffd \ufffd please"


def test_clear_starts_a_new_conversation_and_exit_leaves(fake, workspace):
    fake.reply(text("First answer."), text("Fresh answer."), text("never sent"))
    done = run_cli(fake, workspace, "hello\n/clear\nwho are you?\n/exit\nthis line is never read\n")
    assert done.returncode == 0 and "A new conversation" in done.stdout
    assert plain(fake.requests[-1]["messages"]) == [{"role": "user", "content": [{"type": "text",
                                                                                  "text": "who are you?"}]}]
    assert len(fake.requests) == 2, "/exit left before the next line"


def test_help_names_every_command_and_how_to_stop(fake, workspace):
    done = run_cli(fake, workspace, "/help\n/frobnicate\n")
    assert "Unknown command /frobnicate" in done.stdout and fake.requests == []
    for said in ("/compact [focus]", "/context", "/clear", "/exit", "Ctrl-C", "Ctrl-D", "--resume", "--list",
                 'a block typed between two lines of """'):
        assert said in done.stdout, said


def test_compact_never_makes_the_context_larger(fake, workspace):
    fake.reply(text("a long answer " * 2_000))
    fake.summary(text("<summary>The user said hello; a long answer followed.</summary>"))
    done = run_cli(fake, workspace, "hello\n/compact\n/compact\n/context\n")
    assert done.returncode == 0, done.stderr
    assert "[compact_history] 2 messages → summary" in done.stdout
    assert "[compact_history] nothing to compact: a summary would not make the context smaller" in done.stdout
    assert len(fake.summary_requests) == 1, "the second /compact does not call the model"


def test_ctrl_c_during_compact_keeps_the_history(fake, workspace):
    fake.reply(text("first answer " * 2_000), text("after the interrupt"))  # long enough to be worth a summary
    fake.summary(dict(text("<summary>late</summary>"), delay=5))
    cli = LiveCLI(fake, workspace)
    cli.type("hello\n/compact\n")
    cli.wait_for(lambda: len(fake.requests) == 2)  # the summary request, answered only after 5 s
    cli.proc.send_signal(signal.SIGINT)
    assert cli.finish("still there?\n") == 0 and "Traceback" not in cli.proc.stderr.read()
    assert "interrupted" in cli.output and "after the interrupt" in cli.output
    assert [m["role"] for m in fake.requests[-1]["messages"]] == ["user", "assistant", "user"]
    assert fake.requests[-1]["messages"][0]["content"][0]["text"] == "hello"


def _run_in_terminal(fake, workspace, keys: bytes, **env) -> str:
    """Run the CLI on a pseudo-terminal, type keys, return everything it showed."""
    terminal = Terminal(fake, workspace, **env)
    terminal.read_until(b"s08 >> ")
    terminal.type(keys)
    terminal.read_until(b"s08 >> ", 2)  # the turn is over when the prompt is back
    assert terminal.finish() == 0
    return terminal.text


def test_ctrl_c_at_the_permission_question_returns_to_the_prompt(fake, workspace):
    (workspace / "notes.txt").write_text("keep me\n")
    fake.reply(tool_use("bash", {"command": "rm notes.txt"}), text("the turn should have ended"))
    terminal = Terminal(fake, workspace)
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b"remove the notes\r")
    assert terminal.read_until(b"Allow? [y/N] ")
    terminal.wait_for_input()
    terminal.type(b"\x03")
    assert terminal.read_until(b"s08 >> ", 2)
    assert terminal.finish() == 0
    assert "interrupted" in terminal.text and "Traceback" not in terminal.text
    assert len(fake.requests) == 1, "no model call after Ctrl-C: the turn ended"
    assert (workspace / "notes.txt").read_text() == "keep me\n"


def test_the_up_arrow_at_a_permission_question_never_brings_back_an_earlier_yes(fake, workspace):
    (workspace / "a.txt").write_text("a\n")
    (workspace / "b.txt").write_text("keep me\n")
    fake.reply(tool_use("bash", {"command": "rm a.txt"}), tool_use("bash", {"command": "rm b.txt"}), text("done"))
    terminal = Terminal(fake, workspace)
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b"remove both\r")
    for count, keys in ((1, b"y\r"), (2, b"\x1b[A\r")):  # yes to the first; up arrow and Enter at the second
        assert terminal.read_until(b"Allow? [y/N] ", count)
        terminal.wait_for_input()
        terminal.type(keys)
    assert terminal.read_until(b"s08 >> ", 2)
    assert terminal.finish() == 0
    assert not (workspace / "a.txt").exists() and (workspace / "b.txt").read_text() == "keep me\n"


def test_a_slow_summary_shows_a_spinner_with_its_label(fake, workspace):
    fake.reply(text("a long answer " * 2_000))
    fake.summary(dict(text("<summary>Short.</summary>"), delay=1.5))
    terminal = Terminal(fake, workspace)
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b"hello\r")
    assert terminal.read_until(b"s08 >> ", 2)
    terminal.type(b"/compact\r")
    assert terminal.read_until(b"writing the summary 0."), "the screen moves while the summary is written"
    assert terminal.read_until(b"[compact_history]")
    assert terminal.read_until(b"s08 >> ", 3)
    assert terminal.finish() == 0


def test_a_terminal_gets_colour_and_a_status_line_unless_no_color(fake, workspace):
    fake.reply(text("Hello from the model."), text("Again."))
    coloured = _run_in_terminal(fake, workspace, b"hi\r")
    assert "s08 >> " in coloured and "Hello from the model." in coloured
    assert "\033[2mcontext " in coloured, "the status line is dim on a terminal"
    plain_terminal = _run_in_terminal(fake, workspace, b"hi\r", NO_COLOR="1")
    assert "\033[2m" not in plain_terminal and "\033[36m" not in plain_terminal
    status = re.search(r"^context \S+/200\.0k tokens \(\d+%\) · auto-compact in ", plain_terminal, re.M)
    assert status, "after the turn, the status line: the context's size and how far auto-compact is"
    after_prompt = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", plain_terminal).rsplit("s08 >> ", 1)[1]
    after_prompt = after_prompt.replace("\r", "")
    assert after_prompt.startswith("\n") and after_prompt.endswith(" --resume\n"), \
        "after Ctrl-D: a new line, how to come back, and the shell's prompt on a line of its own"


@pytest.mark.parametrize("found_first", [True, False])
def test_the_way_back_names_the_python_that_runs_the_program(fake, workspace, tmp_path, found_first):
    """The exit hint's interpreter is the one running the program: "python" only when that is
    the python the shell finds, else its full path (a virtual environment not activated)."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "python").symlink_to(sys.executable)  # the same program, but another python to the shell
    first = os.path.dirname(sys.executable) if found_first else str(other)
    fake.reply(text("Hello."))
    shown = _run_in_terminal(fake, workspace, b"hi\r", PATH=f"{first}:{os.environ.get('PATH', '')}")
    plain_text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    command = re.search(r"To come back to this session later:\r\n  (.*) \S+code\.py --resume", plain_text).group(1)
    assert command == ("python" if found_first else shlex.quote(sys.executable))
