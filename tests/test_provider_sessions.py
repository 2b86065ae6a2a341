"""One whole session per provider behaviour, as a user runs it: the CLI as a subprocess,
no CONTEXT_WINDOW, an endpoint whose real window is far smaller than the 200,000 the
program assumes, and a 60-step reading task. Each must finish, be refused for size at
most once, send no invalid request, and lose nothing."""

import hashlib
import re

import pytest

from conftest import blocks, run_cli, wait_until
from s08_context_compact.offline.fake_anthropic import (OVERFLOWS, PROVIDERS, FakeAnthropic, broken_tool_json, count_tokens, error_event, hang,
                            is_summary_request, malformed, pings_only, text, tool_use)

STEPS = 60
WINDOW = 16_000  # the endpoint's real window; the program starts out assuming 200,000
REQUEST = "Read every file in docs/ in order, one read_file call per file, then say you are done."
DONE = "All 60 parts read."


def marker(n: int) -> str:
    return f"MARK-{n:02d}-{hashlib.sha1(str(n).encode()).hexdigest()[:10]}"


def make_docs(workspace) -> None:
    docs = workspace / "docs"
    docs.mkdir()
    for n in range(STEPS):
        (docs / f"part{n:02d}.txt").write_text(
            f"{marker(n)}\n" + "\n".join(f"line {k} of part {n}: the quick brown fox jumps over it"
                                         for k in range(26)) + "\n")


def reading_script(extra: dict | None = None) -> list:
    """Sixty reads, then the final answer; `extra` puts misbehaving replies before some steps."""
    script = []
    for n in range(STEPS):
        script += (extra or {}).get(n, [])
        script.append(tool_use("read_file", {"path": f"docs/part{n:02d}.txt"}))
    return script + [text(DONE)]


def run_session(fake, workspace, timeout=90, **env):
    return run_cli(fake, workspace, REQUEST + "\n", timeout=timeout, **{"MODEL_ID": "test-model", **env})


def assert_session_kept_its_promises(fake, workspace, done):
    output = done.stdout + done.stderr
    refusals_allowed = 4 if OVERFLOWS[fake.overflow].body == "silent" else 1  # an empty reply is tried again
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert DONE in done.stdout, output[-3000:]
    assert len(fake.overflows) <= refusals_allowed, f"refused for size {len(fake.overflows)} times: {fake.overflows}"
    assert fake.invalid == [], fake.invalid
    # the request being worked on reaches the model in every request of the task
    for body in fake.main_requests:
        said = [b.get("text", "") for m in body["messages"] if m["role"] == "user" for b in blocks(m)]
        assert any(REQUEST in t for t in said), "the current request was lost"
    # every part that was read is on disk: in the session log, or where a layer saved it
    saved = "".join(p.read_text(errors="replace") for folder in (".transcripts", ".task_outputs")
                    for p in (workspace / folder).rglob("*") if p.is_file())
    lost = [n for n in range(STEPS) if marker(n) not in saved]
    assert not lost, f"parts never saved: {lost}"
    return output


# Each provider as the fake plays it (its wording, usage, auth, thinking, ids, no Models API
# or count_tokens), plus the overflow wordings no provider preset uses.
BEHAVIOURS = {**{name: dict(settings) for name, settings in PROVIDERS.items() if name != "anthropic"},
              **{f"says-{style}": {"overflow": style} for style in ("anthropic", "anthropic_max_tokens", "413", "413_empty",
                                                          "glm", "glm_short", "context_length_exceeded",
                                                          "litellm_precall")}}
STATES_THE_WINDOW = ("anthropic", "anthropic_max_tokens", "openai", "vllm", "kimi", "litellm_precall")


def test_every_overflow_wording_has_a_session():
    assert {b.get("overflow", "anthropic") for b in BEHAVIOURS.values()} == set(OVERFLOWS)


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_a_reading_session_on_each_provider_behaviour(workspace, behaviour):
    make_docs(workspace)
    settings = dict(BEHAVIOURS[behaviour])
    env = {}
    if settings.get("auth") == "bearer":  # as OpenRouter is configured: a token, and an empty key
        env = {"ANTHROPIC_API_KEY": "", "ANTHROPIC_AUTH_TOKEN": "or-token"}
        settings["token"] = "or-token"
    with FakeAnthropic(context_window=WINDOW, **settings) as fake:
        fake.reply(*reading_script())
        done = run_session(fake, workspace, **env)
        output = assert_session_kept_its_promises(fake, workspace, done)
        silent = OVERFLOWS[settings.get("overflow", "anthropic")].body == "silent"  # an empty reply, tried twice
        assert 1 <= len(fake.overflows) <= (4 if silent else 1), "the real window is smaller than the assumed " \
            "one: one refusal teaches it (an empty reply: once it came back empty again, as plain text too)"
        assert "[window]" in output  # then reactive_compact, unless only max_tokens made the request too big
        if settings.get("overflow") in STATES_THE_WINDOW:
            assert f"the endpoint's limit is {WINDOW:,} tokens (was assuming 200,000)" in output
        assert len(fake.model_lookups) == 1, "the Models API is asked once, at start"
        if not fake.count_tokens_api:
            assert fake.count_token_calls <= 1, "a 404 from count_tokens is not asked again"
        if settings.get("auth") == "bearer":
            assert fake.auth_headers and all(h["authorization"] == "Bearer or-token" for h in fake.auth_headers)


def test_a_reading_session_through_malformed_replies(workspace):
    make_docs(workspace)
    trouble = {3: [malformed("sse_not_json")], 7: [malformed("empty_body")], 11: [error_event()],
               15: [malformed("json_body", reply=tool_use("glob", {"pattern": "docs/*"}))],
               19: [broken_tool_json("read_file")], 23: [tool_use("read_file", "docs/part23.txt")],
               27: [tool_use("bash", ["ls"])], 31: [dict(text("half a reply " * 30), drop_after_block=0)]}
    with FakeAnthropic(context_window=WINDOW) as fake:
        fake.reply(*reading_script(trouble))
        done = run_session(fake, workspace)
        output = assert_session_kept_its_promises(fake, workspace, done)
        for said in ("not JSON", "reply was empty", "error inside the reply stream: overloaded_error",
                     "connection dropped", "not a JSON object"):
            assert said in output, said


def test_a_reading_session_through_an_endpoint_that_stalls(workspace):
    make_docs(workspace)
    with FakeAnthropic(context_window=WINDOW) as fake:
        fake.reply(*reading_script({2: [hang(30)], 5: [pings_only(30)]}))
        done = run_session(fake, workspace, API_IDLE_TIMEOUT="1")
        output = assert_session_kept_its_promises(fake, workspace, done)
        assert "did not answer in time" in output and "nothing but pings" in output
        wait_until(lambda: fake.stalls == ["client closed", "client closed"])


def test_a_learned_window_survives_resume(workspace):
    make_docs(workspace)
    with FakeAnthropic(context_window=WINDOW, **PROVIDERS["minimax"]) as fake:
        fake.reply(*reading_script())
        output = assert_session_kept_its_promises(fake, workspace, run_session(fake, workspace))
        learned = re.search(r"assuming a window of ([\d,]+) from now on", output).group(1)
        fake.reply(tool_use("read_file", {"path": "docs/part00.txt"}), text("resumed fine"))
        resumed = run_cli(fake, workspace, "read part 0 again\n/context\n", args=["--resume"], MODEL_ID="test-model")
        assert resumed.returncode == 0 and "resumed fine" in resumed.stdout, resumed.stdout + resumed.stderr
        assert f"Window: {learned} tokens, from an overflow that named no limit" in resumed.stdout
        assert "max_tokens against it" in resumed.stdout
        assert fake.model_lookups == ["test-model"], "the Models API's 404 is remembered by --resume"
        assert len(fake.overflows) == 1 and fake.invalid == []


def test_kimi_counting_cache_reads_in_input_tokens_learns_the_window_and_goes_through_two_overflows(workspace):
    """Kimi's input_tokens already hold the cache reads: the window it names is learned even
    though adding the reads made an answered prompt look bigger than that; and a second
    "too long" later in the same turn is compacted again rather than ending the turn."""
    docs = workspace / "docs"
    docs.mkdir()
    for n in range(20):  # about 2,900 tokens each as read: under the budget of the window learned
        (docs / f"part{n:02d}.txt").write_text(f"{marker(n)}\n" + "the quick brown fox jumps over it\n" * 250)
    read = iter(range(20))

    def step(body):
        """The next file, until the second refusal has been got over. Once the window is
        learned, the files are code, which the endpoint counts far denser than the program
        estimates (the fake has one rate: from then on it counts every character so)."""
        if fake.overflows and fake.chars_per_token == 3.5 and 8_000 < count_tokens(body) < 11_000:
            fake.chars_per_token = 1.5
        if len(fake.overflows) >= 2:
            return text(DONE)
        return tool_use("read_file", {"path": f"docs/part{next(read):02d}.txt"})

    with FakeAnthropic(context_window=32_000, **PROVIDERS["kimi"]) as fake:
        fake.reply(*[step] * 20)
        done = run_session(fake, workspace, SUMMARY_AHEAD="off")
    output = done.stdout + done.stderr
    assert done.returncode == 0 and DONE in done.stdout, output[-3000:]
    assert "the endpoint's limit is 32,000 tokens (was assuming 200,000)" in output
    assert "input_tokens include the cache reads" in output and "the window stays" not in output
    refused = [r for r in fake.requests if not r.get("_valid")]
    assert len(refused) == 2 and output.count("[reactive_compact]") == 2, fake.overflows
    assert fake.requests[-1]["_valid"] and not is_summary_request(fake.requests[-1]), "answered after the second"
