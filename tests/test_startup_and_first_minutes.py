"""What a newcomer meets in the first ten minutes: settings with a mistake in them, a
misspelt model, the project's AGENTS.md, a flaky endpoint, --list and --resume, how tool
calls look, and the terminal at start, at Ctrl-C and at the end."""

import json
import re
from dataclasses import replace

import pytest
from anthropic.resources.messages.messages import DEPRECATED_MODELS
from conftest import Terminal, run_cli
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, text, tool_use
from test_repl import ESCAPES, columns_of, screen_lines


# ---------------------------------------------------------------- settings with a mistake in them

def dotenv(data: bytes):
    return lambda ws: (ws / ".env").write_bytes(data)


def unreadable_dotenv(ws):
    (ws / ".env").symlink_to("/proc/self/mem")  # a regular file whose first byte cannot be read, even by root


MISTAKES = {  # case: (how the workspace is set up, environment, what the one line must say)
    "dotenv-not-utf8": (dotenv(b"MODEL_ID=caf\xe9\n"), {}, ".env is not UTF-8 text (line 1 holds the byte 0xe9)"),
    "dotenv-unreadable": (unreadable_dotenv, {}, ".env cannot be read (Input/output error). Make it readable"),
    "port-not-a-number": (None, {"ANTHROPIC_BASE_URL": "http://bob:hunter2hunter2@127.0.0.1:80a0"},
                          "ANTHROPIC_BASE_URL='http://127.0.0.1:80a0' is not a usable URL"),
    "ipv6-unclosed": (None, {"ANTHROPIC_BASE_URL": "http://[::1"}, "ANTHROPIC_BASE_URL='http://[::1' is not a usable"),
    "no-scheme": (None, {"ANTHROPIC_BASE_URL": "api.anthropic.com"}, "must start with https:// or http://"),
    "window-not-a-number": (None, {"CONTEXT_WINDOW": "12000²"}, "CONTEXT_WINDOW='12000²' must be a whole number"),
    "space-inside-key": (None, {"ANTHROPIC_API_KEY": "sk-ant one"}, "ANTHROPIC_API_KEY has a character no key has"),
}


@pytest.mark.parametrize("case", MISTAKES)
def test_a_setting_it_cannot_start_with_is_one_line_naming_it(fake, workspace, case):
    setup, env, said = MISTAKES[case]
    if setup:
        setup(workspace)
    done = run_cli(fake, workspace, "hello\n", **env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "hunter2" not in done.stderr, "a proxy's password in the URL is never shown"
    assert fake.requests == [], "nothing was sent"


def test_a_key_with_a_newline_is_used_without_it_and_said_once(fake, workspace):
    done = run_cli(fake, workspace, "hello\n", ANTHROPIC_API_KEY="sk-test-key\n")
    assert done.returncode == 0 and "Done." in done.stdout, done.stdout + done.stderr
    assert "[config] ANTHROPIC_API_KEY has a line break before or after it, which the program leaves out" in done.stdout
    assert "[api]" not in done.stdout, "no retry blamed on the network"
    assert {h["x-api-key"] or h["authorization"] for h in fake.auth_headers} <= {"sk-test-key", "Bearer sk-test-key"}


def test_an_empty_dotenv_is_told_what_it_lacks_and_a_folder_named_dotenv_is_passed_over(fake, workspace):
    (workspace / ".env").write_text("# nothing yet\n")
    done = run_cli(fake, workspace, "", ANTHROPIC_API_KEY="", MODEL_ID="")
    assert done.returncode == 2 and "Copy .env.example" not in done.stderr, done.stderr
    assert f"{workspace / '.env'} does not set them. Add to it:" in done.stderr
    assert "    ANTHROPIC_API_KEY=<your key>" in done.stderr and "    MODEL_ID=claude-sonnet-5-5" in done.stderr
    assert "or export them in your shell" in done.stderr
    done = run_cli(fake, workspace, "", ANTHROPIC_API_KEY="", MODEL_ID="claude-sonnet-5-5")
    assert f"{workspace / '.env'} does not set it. Add to it:" in done.stderr, "one setting missing: it, not them"
    assert "or export it in your shell" in done.stderr and "MODEL_ID=" not in done.stderr
    (workspace / ".env").unlink()
    (workspace / ".env").mkdir()  # a virtual environment is often called .env
    done = run_cli(fake, workspace, "hello\n")
    assert done.returncode == 0 and "Done." in done.stdout and done.stderr == "", done.stderr


# ---------------------------------------------------------------- the model, before the first prompt

def test_a_misspelt_model_is_named_with_the_closest_before_the_first_prompt(workspace):
    models = ["claude-haiku-4-5", "claude-sonnet-5-5", "claude-opus-5-5"]
    with FakeAnthropic(models=models) as fake:
        done = run_cli(fake, workspace, "hello\n", MODEL_ID="claude-sonet-5-5")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("MODEL_ID='claude-sonet-5-5': the endpoint has no such model. The closest of the 3 "
                                   "it lists: claude-sonnet-5-5, claude-opus-5-5, claude-haiku-4-5. Set MODEL_ID in "
                                   ".env or your shell.")
    assert fake.requests == []
    with FakeAnthropic(models=models, models_list="openai") as fake:  # a list that may be partial: go on
        done = run_cli(fake, workspace, "hello\n", MODEL_ID="served-but-not-listed")
    assert done.returncode == 0 and len(fake.requests) == 1, done.stdout + done.stderr
    assert "[endpoint] MODEL_ID='served-but-not-listed' is not among the 3 models the endpoint lists" in done.stdout


def test_a_base_url_ending_in_v1_is_taken_off_and_the_models_api_still_answers(workspace):
    with FakeAnthropic(models=["claude-test"], max_input_tokens=64_000) as fake:
        done = run_cli(fake, workspace, "hello\n/context\n", ANTHROPIC_BASE_URL=fake.url + "/v1/")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"[config] ANTHROPIC_BASE_URL ends in /v1/, which the program adds itself; "
                                  f"using {fake.url} (take the ending off")
    assert fake.model_lookups == ["claude-test"] and "64,000-token window" in done.stdout
    assert len(fake.requests) == 1 and "Done." in done.stdout


# ---------------------------------------------------------------- the project's AGENTS.md

def system_text(request: dict) -> str:
    return json.dumps(request["system"], ensure_ascii=False)


def test_agents_md_is_in_every_request_and_its_size_in_context(fake, workspace, tmp_path):
    (workspace / "AGENTS.md").write_text("Run `make check` before you say a change is done.\n"
                                         "Deploy token: tok-0123456789abcdef\n")
    fake.reply(text("Noted. " * 300), text("Still noted."))
    done = run_cli(fake, workspace, "hello\n/compact\nand now?\n/context\n", DEPLOY_TOKEN="tok-0123456789abcdef")
    assert done.returncode == 0 and "[compact_history]" in done.stdout, done.stdout + done.stderr
    first, summary, after = fake.main_requests[0], fake.summary_requests[0], fake.main_requests[-1]
    for request in (first, summary, after):  # the summary replaced the history, not the system prompt
        assert "Run `make check` before you say a change is done." in system_text(request)
    assert "tok-0123456789abcdef" not in json.dumps(fake.requests) and "Deploy token: [redacted]" in system_text(first)
    row = re.search(r"^  instructions \(AGENTS\.md\) +(\d+)", done.stdout, re.M)
    assert row and 0 < int(row.group(1)) < 100, done.stdout
    # a symlink that leads out of the workspace is not read; CLAUDE.md, where the project has it, is, cut when long
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "outside.md").write_text("SECRET PLANS FROM OUTSIDE")
    (other / "AGENTS.md").symlink_to(tmp_path / "outside.md")
    (other / "CLAUDE.md").write_text("".join(f"Rule {n}: keep it short.\n" for n in range(2_000)))
    done = run_cli(fake, other, "hello\n")
    assert "[instructions] AGENTS.md leads outside the workspace; not read." in done.stdout, done.stdout
    size = (other / "CLAUDE.md").stat().st_size
    assert f"[instructions] CLAUDE.md is {size:,} bytes; requests carry its first 19,9" in done.stdout
    system = system_text(fake.main_requests[-1])
    assert "SECRET PLANS" not in system and "Rule 0: keep it short." in system and "Rule 1999" not in system
    assert "cut here, at 19,9" in system and "read_file CLAUDE.md for the rest" in system


# ---------------------------------------------------------------- a flaky endpoint

def test_retry_after_zero_still_backs_off(s08, make_agent, fake):
    agent = make_agent(retry=0.03)
    flaky = error(500, "api_error", "Internal server error", retry=True, retry_after=0)
    fake.reply(flaky, flaky, flaky, text("Back."))
    assert s08.take_turn(agent, [], "hello") and "Back." in agent.out.text
    gaps = [later - earlier for earlier, later in zip(fake.request_times, fake.request_times[1:])]
    assert len(gaps) == 3 and all(gap >= 0.8 * 0.03 * 2 ** n for n, gap in enumerate(gaps)), gaps


# ---------------------------------------------------------------- --list, and how tool calls look

def test_list_after_clear_does_not_call_answered_turns_unanswered(fake, workspace):
    fake.reply(text("one"), text("two"))
    assert run_cli(fake, workspace, "first question\nsecond question\n/clear\n").returncode == 0
    listed = run_cli(None, workspace, "", args=["--list"]).stdout
    assert "first question" in listed and "(not answered)" not in listed, listed


def test_tool_calls_show_the_tool_and_its_main_argument_and_an_edit_its_diff(fake, workspace):
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("import os\nimport sys\nprint(os.getcwd())\n")
    (workspace / "NOTES.md").write_text("# Notes\nThe build is slow.\nAsk Ada.\n")
    old = "The build is slow.\nAsk Ada.\n"
    new = "The build takes 4 minutes.\nAsk Ada.\n" + "".join(f"Step {n}.\n" for n in range(8))
    fake.reply(tool_use("bash", {"command": "wc -l src/*.py"}),
               tool_use("read_file", {"path": "src/app.py", "offset": 1, "limit": 200}),
               tool_use("edit_file", {"path": "NOTES.md", "old_text": old, "new_text": new}), text("Done."))
    done = run_cli(fake, workspace, "look around\n")
    lines = done.stdout.splitlines()
    assert "● bash  wc -l src/*.py" in lines and "  < 3 src/app.py" in lines, lines
    assert "● read_file  src/app.py (lines 1–200)" in lines, lines
    assert "  < lines 1–3: import os ⏎ import sys ⏎ print(os.getcwd())" in lines, "numbers apart from the text"
    at = lines.index("● edit_file  NOTES.md")
    assert lines[at + 1:at + 9] == ["  < Edited NOTES.md", "    − The build is slow.", "    + The build takes 4 minutes.",
                                    "    + Step 0.", "    + Step 1.", "    + Step 2.", "    + Step 3.",
                                    "    … 4 more changed lines"], lines[at:]


# ---------------------------------------------------------------- the terminal: start, Ctrl-C, the end

def test_on_a_terminal_banner_then_recap_warnings_once_a_clean_ctrl_c_and_how_to_come_back(fake, workspace):
    model = next(iter(DEPRECATED_MODELS))  # one the SDK warns about on every request
    fake.reply(text("The parser is fixed."))
    assert run_cli(fake, workspace, "fix the parser\n", MODEL_ID=model).returncode == 0
    sentences = "".join(f"Sentence {n:02d} of 20. " for n in range(1, 21))  # 40-character chunks end inside words
    fake.reply(dict(text(sentences), chunk_delay=0.3), text("Fine."))
    terminal = Terminal(fake, workspace, columns=50, args=["--resume"], MODEL_ID=model)
    assert terminal.read_until(b"s08 >> ")
    assert terminal.text.index("s08 context compact") < terminal.text.index("Resumed session"), "the banner first"
    terminal.type(b"talk\r")
    assert terminal.read_until(b"Sentence 02 of 20. ")
    terminal.type(b"\x03")
    assert terminal.read_until(b"s08 >> ", 2)
    assert re.search(r"Sentence 02 of 20\. (\^C)?\r\n\(interrupted", terminal.text), \
        "the streamed line ends where the text stopped; the word held back is not printed after ^C"
    assert terminal.turn(b"again\r")
    assert terminal.finish() == 0
    kept = fake.requests[-1]["messages"][-2]["content"][0]["text"]
    assert kept.split("\n\n")[0] == "Sentence 01 of 20. Sentence 02 of 20.", "what was shown, and no more"
    plain = ESCAPES.sub("", terminal.text)
    command = re.search(r"To come back to this session later:\r\n  (\S*python\S* \S+code\.py --resume)\r\n", plain)
    assert command, "how to come back, as one command to copy"
    lines = [line for line in screen_lines(terminal.text) if line != f"  {command.group(1)}"]
    assert all(columns_of(line) <= 50 for line in lines), [line for line in lines if columns_of(line) > 50]
    warning = [n for n, line in enumerate(lines) if line.startswith("[warning] The model")]
    assert len(warning) == 1, "two requests, one warning"
    said = " ".join(line.strip() for line in lines[warning[0]:warning[0] + 6])
    assert f"The model '{model}' is deprecated and will reach end-of-life on" in said, "wrapped between words"


def test_a_env_that_leads_nowhere_or_has_a_second_name_is_named_before_the_missing_settings(fake, workspace, tmp_path):
    """Why a .env was not read is said first: the missing key is the consequence, not the cause."""
    (workspace / ".env").symlink_to(workspace / "gone.env")
    done = run_cli(fake, workspace, "", ANTHROPIC_API_KEY="", MODEL_ID="")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "is a link to" in said and "which does not exist: nothing is read from it" in said
    assert said.index("which does not exist") < said.index("Neither ANTHROPIC_API_KEY"), said
