"""Odd input gets one line, never a traceback: numbers out of any sensible bounds, in a
setting or in what the endpoint sends, and bytes that are not UTF-8 wherever they come
from (a folder's name, a file's, the environment)."""

import pytest
from conftest import run_cli
from s08_context_compact.offline.fake_anthropic import FakeAnthropic, error, text

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
