"""The REPL as people meet it: start-up, pastes, the terminal's width, history."""

import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import cli_runner
import pytest
from conftest import CODE, Terminal, run_cli, context_breakdown
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, text, tool_use
from s08_context_compact.basics import terminal  # noqa: E402
from s08_context_compact.command_line import handle_command


def imported_modules(workspace, *args, python_flags=()) -> tuple:
    """(the program's run, the top-level modules it imported)."""
    done = subprocess.run([sys.executable, *python_flags, "-X", "importtime", str(CODE), *args], capture_output=True,
                          text=True, cwd=workspace, env={"PATH": "/usr/bin:/bin", "HOME": str(workspace)}, timeout=60)
    modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done, modules


def test_help_and_list_answer_without_importing_the_sdk(workspace):
    for args in (["--help"], ["--list"]):
        done, modules = imported_modules(workspace, *args)
        assert done.returncode == 0 and ("usage:" in done.stdout or "No sessions" in done.stdout), done.stderr
        assert "json" in modules, "the import log is read"
        assert "anthropic" not in modules and "httpx2" not in modules, args


@pytest.mark.parametrize("has_venv", [False, True], ids=["no-venv-yet", "venv-beside-it"])
def test_a_python_without_the_requirements_is_told_how_to_install_them(tmp_path, workspace, has_venv):
    # a copy of the program in a tree of its own: whether <repo>/.venv exists is this test's choice
    root = tmp_path / "repo"
    shutil.copytree(CODE.parent, root / CODE.parent.name, ignore=shutil.ignore_patterns("__pycache__"))
    if has_venv:
        (root / ".venv").mkdir()
    # -S leaves out site-packages: a Python that never had the requirements installed
    done = subprocess.run([sys.executable, "-S", str(root / CODE.parent.name / CODE.name)], capture_output=True,
                          text=True, cwd=workspace, env={"PATH": "/usr/bin:/bin", "MODEL_ID": "m",
                                                         "ANTHROPIC_API_KEY": "k"}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "This Python lacks anthropic and python-dotenv, which the program needs:" in done.stderr
    lines = [line.strip() for line in done.stderr.splitlines()]
    assert f"cd {root}" in lines, done.stderr
    after_cd = lines[lines.index(f"cd {root}") + 1:]
    make_venv = "" if has_venv else "python3 -m venv .venv && "  # a second .venv would replace the first
    assert after_cd[0] == f"{make_venv}. .venv/bin/activate", done.stderr
    assert after_cd[1].endswith("pip install -r requirements.txt"), done.stderr
    assert ("-m venv" in done.stderr) != has_venv
    own_words = [line for line in done.stderr.splitlines() if str(root) not in line and sys.executable not in line]
    assert max(map(len, own_words)) <= 80, "it fits a terminal"


def older_python() -> str | None:
    """A Python older than 3.10 found on PATH (older still cannot read code.py at all), as
    the file it really runs: a pyenv shim may name a version pyenv does not have, and it
    needs the PATH the program is run without."""
    for name in ("python3.9", "python3.8"):
        found = shutil.which(name)
        asked = found and subprocess.run([found, "-c", "import sys; print(sys.executable, sys.version_info < (3, 10))"],
                                         capture_output=True, text=True, timeout=30)
        if asked and asked.returncode == 0 and asked.stdout.split()[1:] == ["True"]:
            return asked.stdout.split()[0]
    return None


def test_a_python_too_old_is_told_so_in_one_line(workspace):
    old = older_python()
    if old is None:
        pytest.skip("no python3.9 or python3.8 on PATH to run the program with")
    done = subprocess.run([old, str(CODE)], capture_output=True, text=True, cwd=workspace, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "MODEL_ID": "m", "ANTHROPIC_API_KEY": "k"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("This program needs Python 3.10 or newer; this is Python 3.")


# ---------------------------------------------------------------- several lines, one message

def test_a_bracketed_paste_is_one_message(fake, workspace):
    fake.reply(text("It is a NameError."))
    terminal = Terminal(fake, workspace)
    assert terminal.read_until(b"s08 >> ")
    assert b"\x1b[?2004h" in terminal.shown, "the program asks the terminal to mark pastes"
    pasted = 'why does this fail?\nTraceback (most recent call last):\n  File "x.py", line 1\nNameError: x'
    terminal.type(b"\x1b[200~" + pasted.encode() + b"\x1b[201~\r")  # how a terminal sends a paste
    assert terminal.read_until(b"s08 >> ", 2)
    assert terminal.finish() == 0
    assert len(fake.requests) == 1, "one model call for the whole paste"
    assert fake.requests[0]["messages"][0]["content"][0]["text"] == pasted


def test_a_triple_quoted_block_or_a_trailing_backslash_makes_one_message(fake, workspace):
    fake.reply(text("one"), text("two"), text("three"))
    done = run_cli(fake, workspace, '"""\nfirst line\n\n  indented line\n"""\nsecond \\\nmessage\nthird\n')
    assert done.returncode == 0, done.stderr
    asked = [r["messages"][-1]["content"][-1]["text"] for r in fake.requests]
    assert asked == ["first line\n\n  indented line", "second \nmessage", "third"]


# ---------------------------------------------------------------- the terminal's width

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(shown: str) -> list:
    """The lines as they stand on the screen: escapes gone, and what a carriage return
    wrote over (the spinner) replaced by what came after it."""
    lines = []
    for line in ESCAPES.sub("", shown).split("\r\n"):
        lines.append(line.split("\r")[-1])
    return lines


def columns_of(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def test_at_50_columns_every_line_fits_the_terminal(fake, workspace):
    (workspace / "notes.md").write_text("上下文压缩把旧的工具结果换成指向磁盘文件的指针，" * 40 + "\n" + "word " * 400)
    fake.reply(tool_use("read_file", {"path": "notes.md"}),
               tool_use("bash", {"command": "echo " + "a-rather-long-argument " * 8}),
               text("The notes explain compaction in Chinese and then repeat a word many times, which is "
                    "what you see when a file is padded. 这段笔记用中文解释了上下文压缩，然后重复了一个词很多次。\n"
                    "```python\ndef a_function_with_a_long_name(argument_one, argument_two, argument_three):\n"
                    "    return argument_one\n```\nThat is all."))
    fake.summary(text("<summary>1. Primary request: read notes.md, which explains in Chinese how compaction "
                      "swaps old results for pointers.\n2. 关键概念：上下文压缩、工具结果、指针、磁盘文件、摘要。</summary>"))
    terminal = Terminal(fake, workspace, columns=50, CONTEXT_WINDOW=12_000)
    assert terminal.read_until(b"s08 >> ")
    assert terminal.turn(b"read notes.md\r") and terminal.turn(b"/compact\r") and terminal.turn(b"/context\r")
    assert terminal.finish() == 0
    code = "def a_function_with_a_long_name(argument_one, argument_two, argument_three):"
    assert code in terminal.text, "code keeps its lines: a break inserted there would break what is copied"
    come_back = re.search(r"\n(  \S*python\S* \S+ --resume)\r", terminal.text).group(1)  # a command, to copy whole
    lines = [line for line in screen_lines(terminal.text) if line not in (code, come_back)]
    assert any(line.startswith("  tool results") for line in lines), "/context was shown too"
    assert any("● read_file  notes.md" in line for line in lines) and any("[compact_history]" in line for line in lines)
    assert any("关键概念" in line for line in lines), "the summary's preview is shown"
    too_wide = [line for line in lines if columns_of(line) > 50]
    assert not too_wide, too_wide
    said = " ".join(line.strip() for line in lines)
    assert "repeat a word many times, which is" in said, "the model's text is wrapped between words, not inside"


# ---------------------------------------------------------------- history between runs

def test_prompts_are_kept_between_runs_with_secrets_redacted(fake, workspace):
    fake.reply(text("noted"), text("pasted"), text("blocked"), text("again"))
    home = workspace / "home"
    home.mkdir()
    env = {"HOME": str(home), "S08_HISTORY": "", "DEPLOY_TOKEN": "s3cr3t-deploy-value"}
    first = Terminal(fake, workspace, **env)
    assert first.read_until(b"s08 >> ")
    assert first.turn(b"remember the token s3cr3t-deploy-value\r")
    assert first.turn(b"\x1b[200~a pasted line\nand its second line\x1b[201~\r")
    assert first.turn(b'"""\rblock line s3cr3t-\rdeploy-value\r"""\r')  # a secret cut by a line break
    assert first.finish() == 0
    saved = home / ".s08_history"
    assert "remember the token [redacted]" in saved.read_text() and "s3cr3t" not in saved.read_text()
    for piece in ("pasted line", "block line", '"""'):
        assert piece not in saved.read_text(), "a message of several lines would come back in pieces"
    assert saved.stat().st_mode & 0o777 == 0o600
    second = Terminal(fake, workspace, **env)
    assert second.read_until(b"s08 >> ")
    second.type(b"\x1b[A")  # the up arrow
    assert second.read_until(b"remember the token [redacted]"), "the last run's prompt comes back"
    second.type(b"\x15\x04")  # clear the line, then end
    second.finish()


def test_history_can_be_turned_off(fake, workspace):
    home = workspace / "home"
    home.mkdir()
    fake.reply(text("fine"))
    terminal = Terminal(fake, workspace, HOME=str(home), S08_HISTORY="off")
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b"hello\r")
    assert terminal.read_until(b"s08 >> ", 2)
    assert terminal.finish() == 0
    assert list(home.iterdir()) == []


# ---------------------------------------------------------------- sessions: --list and --resume

def test_list_shows_the_first_prompt_and_resume_says_where_the_conversation_was(fake, workspace):
    fake.reply(text("Started on the parser. " * 400), text("The parser is fixed; the tests pass."))
    fake.summary(text("<summary>Working on the parser.</summary>"))
    first = run_cli(fake, workspace, "fix the parser please\n/compact\nand run the tests\n")
    assert first.returncode == 0 and "[compact_history]" in first.stdout, first.stdout
    listing = run_cli(None, workspace, "", args=["--list"])
    assert "fix the parser please" in listing.stdout, "the session's first prompt, not what a summary left"
    fake.reply(text("ok"))
    resumed = run_cli(fake, workspace, "", args=["--resume"])
    assert "you asked: and run the tests" in resumed.stdout
    assert "the model: The parser is fixed; the tests pass." in resumed.stdout


# ---------------------------------------------------------------- start-up

def endpoint_line(output: str) -> str:
    """The start-up line about the endpoint. A line about the sandbox may come before it,
    where bubblewrap cannot start (a user without user namespaces)."""
    return next((line for line in output.splitlines() if line.startswith("[endpoint]")), "")


def test_an_unreachable_endpoint_is_named_at_start(workspace):
    done = run_cli(None, workspace, "")  # ANTHROPIC_BASE_URL is a port nothing listens on
    assert done.returncode == 0 and "Traceback" not in done.stderr
    said = endpoint_line(done.stdout)
    assert said.startswith("[endpoint] cannot reach http://127.0.0.1:9/v1/models/claude-test (")
    assert "check ANTHROPIC_BASE_URL and the network" in said


def test_a_refused_key_is_named_at_start_and_the_first_message_says_where(workspace):
    with FakeAnthropic(auth="bearer", token="another") as fake:  # the key sent is not the one it wants
        done = run_cli(fake, workspace, "hello\n")
    said = endpoint_line(done.stdout)
    assert said.startswith("[endpoint] 401 authentication_error: Invalid bearer token"), done.stdout
    assert f"(from {fake.url}/v1/models/claude-test)" in said and "ANTHROPIC_AUTH_TOKEN" in said
    assert "API error: 401 authentication_error: Invalid bearer token" in done.stdout
    assert f"(from {fake.url}/v1/messages)" in done.stdout and done.returncode == 1


def test_one_message_is_one_message(s08, make_agent):
    agent = make_agent()
    report = context_breakdown(s08, agent, [{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert report.startswith("Context: 1 message, ")
    assert context_breakdown(s08, agent, []).startswith("Context: 0 messages, ")


def test_a_request_the_endpoint_refuses_is_not_worth_sending_again(fake, workspace):
    fake.reply(error(400, "invalid_request_error", "messages.0: unexpected field"), text("fine"))
    done = run_cli(fake, workspace, "hello\nsomething else\n")
    assert "API error: 400 invalid_request_error: messages.0: unexpected field." in done.stdout
    assert "sent unchanged, it would fail again" in done.stdout and "send it again" not in done.stdout
    assert done.returncode == 1 and "fine" in done.stdout


def test_ctrl_d_ends_a_block_and_sends_it(fake, workspace):
    fake.reply(text("got the block"))
    terminal = Terminal(fake, workspace)
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b'"""\rfirst line\rsecond line\r\x04')
    assert terminal.read_until(b"got the block") and terminal.read_until(b"s08 >> ", 2)
    assert terminal.finish() == 0
    assert fake.requests[0]["messages"][0]["content"][0]["text"] == "first line\nsecond line"


def test_a_proxy_password_in_the_url_is_never_shown(workspace):
    done = run_cli(None, workspace, "hello\n", ANTHROPIC_BASE_URL="http://bob:hunter2hunter2@127.0.0.1:9",
                   API_RETRIES="1")  # one retry says it as three would, a second after the call
    assert "cannot reach http://127.0.0.1:9/v1/" in done.stdout and "(retry 1 of 1)" in done.stdout
    assert "hunter2hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize("retries", [0, 1])
def test_api_retries_sets_how_often_a_failing_call_is_sent_again(fake, workspace, retries):
    fake.reply(*[error(529, "overloaded_error", "Overloaded")] * 3, text("Answered."))
    done = run_cli(fake, workspace, "hello\n", API_RETRIES=str(retries))
    assert len(fake.main_requests) == retries + 1, "the call and its retries, no more"
    assert "Answered." not in done.stdout and "Traceback" not in done.stderr
    assert (f"(retry {retries} of {retries})" in done.stdout) == (retries > 0)


def test_api_retries_out_of_bounds_is_refused_in_one_line(workspace):
    done = run_cli(None, workspace, "", API_RETRIES="11")
    assert done.returncode == 2 and "API_RETRIES" in done.stderr + done.stdout and "between 0 and 10" in done.stderr + done.stdout


def test_a_history_file_that_cannot_be_placed_is_no_history(fake, workspace):
    fake.reply(text("fine"))
    terminal = Terminal(fake, workspace, S08_HISTORY="~no-such-user-here/history")
    assert terminal.read_until(b"s08 >> ")
    terminal.type(b"hello\r")
    assert terminal.read_until(b"s08 >> ", 2)
    assert terminal.finish() == 0 and "Traceback" not in terminal.text and "fine" in terminal.text


def test_a_word_split_across_chunks_is_never_broken(s08):
    wrap = terminal.WordWrap(21)
    shown = wrap.feed("Tests pass 🎉cele") + wrap.feed("brate it, 上下文") + wrap.feed("压缩 done") + wrap.finish()
    assert "🎉celebrate" in shown and "celebrate it," in shown.replace("\n", " ")
    assert all(terminal.display_width(line) <= 20 for line in shown.split("\n"))


def test_list_fits_the_terminal_and_marks_a_prompt_never_answered(fake, workspace):
    fake.reply(text("answered " * 30))
    assert run_cli(fake, workspace, "a first prompt that is rather long, so that its row is long too\n").returncode == 0
    fake.reply(error(400, "invalid_request_error", "messages.0: bad"))
    assert run_cli(fake, workspace, "this one fails\n").returncode == 1
    terminal = Terminal(None, workspace, columns=50, args=["--list"])
    terminal.read_until(b"the end of the listing, which never appears", seconds=10)
    assert cli_runner.exit_code(terminal.pid) == 0
    rows = screen_lines(terminal.text)
    assert any(row.startswith("    2 messages, ") for row in rows), rows
    assert all(columns_of(row) <= 50 for row in rows), rows
    listed = run_cli(None, workspace, "", args=["--list"]).stdout  # not a terminal: rows whole
    assert "a first prompt that is rather long" in listed and "this one fails (not answered)" in listed


def test_exit_with_words_after_it_still_leaves(fake, workspace):
    done = run_cli(fake, workspace, "/exit now\nhello\n")
    assert done.returncode == 0 and "Unknown command" not in done.stdout
    assert fake.requests == [], "nothing typed after /exit is sent"


def test_compact_is_followed_by_the_status_line_on_a_terminal(s08, make_agent, fake):
    agent, messages = make_agent(show_status=True), []
    fake.reply(text("A long answer. " * 200))
    fake.summary(text("<summary>The user said hi.</summary>"))
    s08.take_turn(agent, messages, "hi")
    assert re.search(r"^context [\d.]+k?/200\.0k tokens", agent.out.text, re.M), "after a reply: the endpoint's count"
    before = len(agent.out)
    handle_command(agent, messages, "/compact", s08.LESSON)
    shown = "".join(agent.out[before:])
    assert "[compact_history] " in shown
    # a new history no reply has measured yet: our estimate, and marked as one
    assert re.search(r"\ncontext ≈\S+/200\.0k tokens \(\d+%\) · auto-compact in \S+\s*$", shown), shown
