"""Odd input gets one line, never a traceback: numbers out of any sensible bounds, in a
setting or in what the endpoint sends, and bytes that are not UTF-8 wherever they come
from (a folder's name, a file's, the environment)."""

import json
import os

import pytest
from conftest import run_cli
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, text, tool_use

DIGITS_401 = "9" * 401


# ---------------------------------------------------------------- numbers in the settings

@pytest.mark.parametrize("name, value", [
    ("CONTEXT_WINDOW", DIGITS_401),           # was an OverflowError at start
    ("CONTEXT_WINDOW", "100000001"),          # over any window offered
    ("API_IDLE_TIMEOUT", DIGITS_401),         # refused, but quoted whole: a line of 500 characters
    ("API_CONNECT_TIMEOUT", "1e-300"),        # every connection would time out
    ("API_CONNECT_TIMEOUT", "1_0"),           # float() reads these; a setting's number is plain digits
    ("COMPACT_AT", "１"),
    ("SUMMARY_AHEAD", "0.5-０.９"),
])
def test_a_number_setting_out_of_bounds_is_one_short_line_naming_it(fake, workspace, name, value):
    done = run_cli(fake, workspace, "", **{name: value})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name}=") and len(lines[0]) < 300, lines


# ---------------------------------------------------------------- numbers from the endpoint

def test_a_window_of_401_digits_from_the_models_api_is_not_believed(workspace):
    with FakeAnthropic(max_input_tokens=int(DIGITS_401)) as fake:
        done = run_cli(fake, workspace, "hello\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "Done.\n", "the window comes from the table of known models (claude-*)"


def test_a_usage_figure_no_count_can_be_is_left_out(fake, workspace):
    fake.reply(text("first", usage={"output_tokens": int(DIGITS_401)}), text("second"))
    done = run_cli(fake, workspace, "one\ntwo\n/context\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "second" in done.stdout and "threshold" in done.stdout


@pytest.mark.parametrize("message", [
    f"prompt is too long: {DIGITS_401} tokens > {DIGITS_401} maximum",
    f"maximum context length is 100000 tokens. However, you requested {DIGITS_401} tokens",
    f"prompt is too long: 5000 tokens > {'9' * 5000} maximum",  # past int()'s 4,300 digits
])
def test_an_overflow_naming_sizes_no_count_can_be_still_teaches_a_window(fake, workspace, message):
    fake.reply(error(400, "invalid_request_error", message), text("after"))
    done = run_cli(fake, workspace, "hello\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "[window]" in done.stdout and "after" in done.stdout


# ---------------------------------------------------------------- bytes that are not UTF-8

def system_text(fake) -> str:
    system = fake.main_requests[0]["system"]
    return system if isinstance(system, str) else "".join(block["text"] for block in system)


def results_sent(request: dict) -> list:
    """The text of every tool_result a request carried, in order."""
    return [block["content"] for message in request["messages"] if message["role"] == "user"
            for block in message["content"] if block.get("type") == "tool_result"]


def test_a_workspace_and_a_file_named_in_latin_1_are_sent_as_u_fffd_and_found_again(fake, tmp_path):
    workspace = tmp_path / os.fsdecode(b"caf\xe9")  # the folder's name is not UTF-8
    workspace.mkdir()
    (workspace / os.fsdecode(b"men\xfa.txt")).write_bytes(b"soup\n")
    fake.reply(tool_use("glob", {"pattern": "*.txt"}),
               tool_use("read_file", {"path": "men\ufffd.txt"}),  # the name as the model was shown it
               tool_use("write_file", {"path": f"{tmp_path}/caf\ufffd/men\ufffd.txt", "content": "stew\n"}),
               tool_use("read_file", {"path": "/etc/hostname"}),  # refused, naming the workspace
               tool_use("bash", {"command": "printf 'caf\\351\\n'"}),
               text("done"))
    done = run_cli(fake, workspace, "what is on the menu?\n/compact\nand now?\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"working in {tmp_path}/caf\ufffd." in system_text(fake)
    assert "Fake summary" in json.dumps(fake.main_requests[-1]["messages"]), "compacted, and asked again"
    listed, read, wrote, refused, printed = results_sent(fake.main_requests[-2])
    assert listed == "men\ufffd.txt" and "soup" in read and wrote.startswith("Wrote 5 bytes")
    assert f"outside the workspace {tmp_path}/caf\ufffd" in refused and printed.startswith("caf\ufffd")
    assert (workspace / os.fsdecode(b"men\xfa.txt")).read_bytes() == b"stew\n", "the real file was written"
    assert not (workspace / "men\ufffd.txt").exists(), "not a second file under the name shown"


def test_a_skill_whose_folder_is_not_utf8_is_listed_and_loads_by_the_name_shown(fake, workspace):
    skill = workspace / "skills" / os.fsdecode(b"r\xe9sum\xe9")
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_bytes(b"---\ndescription: write a r\xe9sum\xe9\n---\nUse one page.\n")
    fake.reply(tool_use("load_skill", {"name": "r\ufffdsum\ufffd"}), text("loaded"))
    done = run_cli(fake, workspace, "write my cv\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "- r\ufffdsum\ufffd: write a r\ufffdsum\ufffd" in system_text(fake)
    assert "Use one page." in results_sent(fake.main_requests[-1])[0]


def test_a_secret_in_the_environment_that_is_not_utf8_is_still_kept_out(fake, workspace):
    (workspace / "deploy.cfg").write_bytes(b"token=s3cr\xe9t-v4lue-0123\n")
    fake.reply(tool_use("read_file", {"path": "deploy.cfg"}), text("seen"))
    done = run_cli(fake, workspace, "show the token\n", DEPLOY_TOKEN=os.fsdecode(b"s3cr\xe9t-v4lue-0123"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "token=[redacted]" in results_sent(fake.main_requests[-1])[0] and "v4lue" not in json.dumps(fake.requests)


@pytest.mark.parametrize("name", ["MODEL_ID", "ANTHROPIC_BASE_URL"])
def test_a_setting_that_is_not_utf8_is_one_line_naming_it(fake, workspace, name):
    value = {"MODEL_ID": "claude-test", "ANTHROPIC_BASE_URL": fake.url}[name]
    done = run_cli(fake, workspace, "hello\n", **{name: value + os.fsdecode(b"\xe9")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name} holds a byte that is not UTF-8"), lines
    assert fake.requests == [], "nothing was sent"
