"""Anthropic-compatible endpoints: every overflow wording, the window learned from it,
usage that does not add up, other authentication, thinking blocks, odd tool ids, and
replies that are malformed or never come. The fake server plays each provider."""

import json
import time

import anthropic
import pytest

from conftest import assert_valid, blocks, chat, user, wait_until, context_breakdown
from s08_context_compact.offline.fake_anthropic import (OVERFLOWS, FakeAnthropic, broken_tool_json, count_tokens, drip, error_event, hang,
                            error, malformed, pings_only, text, tool_use)
from s08_context_compact.endpoint import model_calls as endpoint_module
from s08_context_compact.endpoint import overflow as overflow_module
from s08_context_compact.session import log_repair
from s08_context_compact.basics import terminal
from s08_context_compact.command_line.user_turns import add_user_text  # noqa: E402
from s08_context_compact.command_line import handle_command
from s08_context_compact.command_line import open_session
from s08_context_compact.endpoint import ContextOverflow, Endpoint
from s08_context_compact.messages import estimate_tokens

TOOLS = [{"name": "bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]


def refused(fake_overflow: str, window: int = 300, max_tokens: int = 100):
    """Send a prompt too big for a small window; return (what the SDK gave back, prompt tokens)."""
    with FakeAnthropic(context_window=window, overflow=fake_overflow) as fake:
        client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
        body = dict(model="m", max_tokens=max_tokens, tools=TOOLS, messages=[user("word " * 400)])
        tokens = count_tokens(body)
        try:
            return client.messages.create(**body), tokens
        except anthropic.APIStatusError as err:
            return err, tokens


# ---------------------------------------------------------------- the overflow detector

EXPECTED_SIZES = {  # overflow style -> (prompt tokens stated?, window stated?)
    "anthropic": (True, True), "anthropic_max_tokens": (True, True), "openai": (True, True),
    "vllm": (True, True), "kimi": (True, True), "413": (False, False), "413_empty": (False, False),
    "llamacpp": (False, False), "minimax": (False, False), "glm": (False, False), "glm_short": (False, False),
    "context_length_exceeded": (False, False), "litellm": (False, False), "stop_reason": (False, False),
    "litellm_llamacpp": (True, True), "litellm_precall": (True, True),  # not streamed: the words come through
}


@pytest.mark.parametrize("style", sorted(OVERFLOWS))
def test_every_overflow_wording_is_recognised_with_its_sizes(s08, style):
    answer, tokens = refused(style)
    if style == "stop_reason":
        overflow = overflow_module.context_overflow(stop_reason=answer.stop_reason)
    else:
        overflow = overflow_module.context_overflow(answer, max_tokens=100)
    assert overflow is not None, f"{style}: {answer}"
    has_prompt, has_window = EXPECTED_SIZES[style]
    assert overflow.prompt_tokens == (tokens if has_prompt else None)
    assert overflow.window == (300 if has_window else None)
    # the prompt alone (about 580 tokens) was over the window of 300: OpenAI's wording then says
    # nothing of max_tokens, since llama-cpp-python uses it and caps max_tokens instead
    assert overflow.counts_output == (style in ("anthropic_max_tokens", "kimi", "minimax", "stop_reason"))


def test_openai_wording_counts_max_tokens_only_when_the_prompt_alone_fit(s08):
    """DeepSeek refuses a prompt that fits only because max_tokens does not; llama-cpp-python
    says the same words of a prompt over its n_ctx, and caps max_tokens itself."""
    with FakeAnthropic(context_window=300, overflow="openai") as fake:
        client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="m", max_tokens=100, messages=[user("word " * 150)])
    deepseek = overflow_module.context_overflow(caught.value, max_tokens=100)
    assert deepseek.prompt_tokens <= 300 and deepseek.counts_output
    llama = overflow_module.context_overflow(ValueError(
        "This model's maximum context length is 4096 tokens. However, you requested 5110 tokens (5010 in the "
        "messages, 100 in the completion). Please reduce the length of the messages or completion."), max_tokens=100)
    assert (llama.prompt_tokens, llama.window, llama.counts_output) == (5010, 4096, False)


def test_litellm_pre_call_wording_names_the_window(s08):
    """LiteLLM with model_info.max_input_tokens refuses before the call, in its own words."""
    said = overflow_module.context_overflow(ValueError(
        "litellm.ContextWindowExceededError: litellm.BadRequestError: litellm._pre_call_checks: Context Window "
        "exceeded for given call. No models have context window large enough for this call.\nModel=openai/smollm, "
        "Max Input Tokens=4096, Got=5035\nmodel=smollm. context_window_fallbacks=None."), max_tokens=100)
    assert (said.prompt_tokens, said.window, said.counts_output) == (5035, 4096, False)


@pytest.mark.parametrize("status, kind, message", [
    (429, "rate_limit_error", "Too many tokens, please wait before trying again."),
    (429, "rate_limit_error", "prompt is too long for this rate limit tier"),
    (529, "overloaded_error", "Overloaded"),
    (400, "invalid_request_error", "messages.1: `tool_use` ids were found without `tool_result` blocks"),
    (500, "api_error", "Internal server error"),
])
def test_what_is_not_an_overflow_is_not_taken_for_one(s08, fake, status, kind, message):
    fake.reply({"error": {"status": status, "type": kind, "message": message}})
    client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="m", max_tokens=10, tools=TOOLS, messages=[user("hi")])
    assert overflow_module.context_overflow(caught.value) is None
    assert overflow_module.context_overflow(stop_reason="end_turn") is None


def test_an_overflow_inside_a_200_stream_is_recognised(s08, make_agent, fake):
    fake.reply(error_event("invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum"))
    agent = make_agent()
    with pytest.raises(ContextOverflow) as caught:
        s08.call_model(agent, [user("hello")])
    assert caught.value.overflow.window == 200_000 and caught.value.overflow.prompt_tokens == 250_000


# ---------------------------------------------------------------- learning and finding the window

def test_a_count_no_tokenizer_would_make_scales_the_estimates_at_most_eight_times_and_says_so(s08, make_agent, fake):
    """One "too long" that counts 250,000 tokens in a request estimated at a few thousand: the
    estimates are scaled up 8 times at most, not 40, and the user is told why."""
    agent = make_agent(window=20_000)
    fake.reply(error_event("invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum"),
               text("Done."))
    assert s08.take_turn(agent, chat(3, 4_000), "go on")
    assert agent.endpoint.undercount == endpoint_module.MAX_UNDERCOUNT == 8.0
    assert "times as many: no tokenizer counts that differently; estimates are scaled up 8 times at most" \
        in agent.out.text.replace("\n", " ")
    handle_command(agent, [], "/context", s08.LESSON)
    assert "it counted 8.0 times this program's estimate" in agent.out.text.replace("\n", " ")


def test_a_stated_window_is_adopted_and_a_larger_one_ignored(s08):
    stated = overflow_module.Overflow("x", prompt_tokens=140_000, window=131_072)
    assert overflow_module.learned_window(stated, window=200_000, sent_tokens=120_000, max_tokens=8_192,
                              largest_accepted=(100_000, 108_192)) == 131_072
    assert overflow_module.learned_window(overflow_module.Overflow("x", 210_000, 200_000), window=150_000, sent_tokens=140_000,
                              max_tokens=8_192, largest_accepted=(0, 0)) == 150_000


def test_without_numbers_the_window_lies_between_answered_and_refused(s08):
    silent = overflow_module.Overflow("the request exceeds the available context size")
    assert overflow_module.learned_window(silent, window=200_000, sent_tokens=33_000, max_tokens=8_192,
                              largest_accepted=(31_000, 39_192)) == 31_000
    counting = overflow_module.Overflow("context window exceeds limit", counts_output=True)
    assert overflow_module.learned_window(counting, window=200_000, sent_tokens=40_000, max_tokens=8_192,
                              largest_accepted=(31_000, 39_192)) == 39_192
    # an estimate of the refused size that is barely above the answered one: stay below it
    assert overflow_module.learned_window(silent, window=200_000, sent_tokens=31_500, max_tokens=8_192,
                              largest_accepted=(31_000, 39_192)) == int(31_500 * 0.95)
    # nothing answered yet: a share below the refused size
    assert overflow_module.learned_window(silent, window=200_000, sent_tokens=30_000, max_tokens=8_192,
                              largest_accepted=(0, 0)) == int(30_000 * overflow_module.NO_NUMBERS_SHRINK)
    # never below the smallest window the program works in
    assert overflow_module.learned_window(silent, window=200_000, sent_tokens=100, max_tokens=8_192,
                              largest_accepted=(0, 0)) == overflow_module.MIN_CONTEXT_WINDOW


@pytest.mark.parametrize("model, window", [
    ("claude-sonnet-4-5", 200_000), ("anthropic/claude-sonnet-4.5", 200_000), ("deepseek-chat", 131_072),
    ("deepseek/deepseek-reasoner", 131_072), ("kimi-k2-0905-preview", 262_144), ("kimi-k2-0711-preview", 131_072),
    ("moonshotai/kimi-k2.5", 262_144), ("glm-4.5-air", 128_000), ("glm-4.6", 200_000), ("GLM-5", 200_000),
    ("MiniMax-M2", 204_800), ("minimax/minimax-m2.7", 204_800), ("llama-3-8b", None),
])
def test_well_known_models_have_a_window_without_the_models_api(s08, model, window):
    found = endpoint_module.known_window(model)
    assert (found[0] if found else None) == window


def test_window_sources_in_order_and_the_404_remembered(s08, fake, monkeypatch):
    client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
    monkeypatch.delenv("CONTEXT_WINDOW", raising=False)
    endpoint = endpoint_module.discover_endpoint(client, "deepseek-chat")
    assert (endpoint.window, endpoint.models_api) == (131_072, False)
    assert "built-in table" in endpoint.window_source and fake.model_lookups == ["deepseek-chat"]
    # a resumed session that learned a window, and that the Models API is missing, keeps both
    endpoint = endpoint_module.discover_endpoint(client, "deepseek-chat", {
        "window": 64_000, "window_source": "the endpoint's overflow message", "learned": True,
        "models_api": False, "count_tokens": False, "counts_output": True})
    assert (endpoint.window, endpoint.can_count_tokens, endpoint.counts_output) == (64_000, False, True)
    assert fake.model_lookups == ["deepseek-chat"], "a 404 remembered is not asked again"
    fake.max_input_tokens = 150_000
    assert endpoint_module.discover_endpoint(client, "deepseek-chat").window == 150_000, "the Models API comes before the table"
    assert endpoint_module.discover_endpoint(client, "deepseek-chat", configured=50_000).window_source == "CONTEXT_WINDOW"


def test_an_overflow_teaches_the_window_and_the_session_is_not_refused_again(s08, make_agent, workspace):
    with FakeAnthropic(context_window=12_000, overflow="openai") as fake:
        agent = make_agent(window=200_000, server=fake)
        for n in range(30):
            (workspace / f"f{n}.txt").write_text(f"file {n} " + "lorem ipsum dolor sit amet " * 60)
        fake.reply(*[tool_use("read_file", {"path": f"f{n}.txt"}) for n in range(30)], text("read them all"))
        messages = []
        s08.take_turn(agent, messages, "read f0 to f29")
        assert len(fake.overflows) == 1 and fake.invalid == []
        assert "[window] the endpoint's limit is 12,000 tokens (was assuming 200,000)" in agent.out.text
        assert agent.settings.window == 12_000 and agent.settings.threshold < 12_000
        assert "read them all" in agent.out.text
        assert "Window: 12,000 tokens, from the endpoint's overflow message; the endpoint counts max_tokens" \
            in context_breakdown(s08, agent, messages)


# ---------------------------------------------------------------- usage from any endpoint

@pytest.mark.parametrize("style", ["no_delta_usage", "zero_start", "includes_cache", "none"])
def test_the_context_size_never_falls_to_zero_or_double(s08, make_agent, style):
    with FakeAnthropic(usage=style) as fake:
        agent = make_agent(server=fake)
        messages = [user("hello " * 2_000)]
        fake.reply(text("hi"), text("again"))
        s08.agent_loop(agent, messages)
        add_user_text(messages, "more")
        s08.agent_loop(agent, messages)  # the second call reads the first from the cache
        true_size = sum(fake.usage_log[-1][k] for k in endpoint_module.USAGE_KEYS)
        measured = s08.context_tokens(agent, messages)
        assert 0.8 * true_size < measured < 1.2 * true_size, (style, measured, true_size)
        report = context_breakdown(s08, agent, messages)
        if style == "none":
            assert "Usage: the endpoint reported no input usage" in report
        if style == "includes_cache":
            assert fake.usage_log[-1]["cache_read_input_tokens"] > 0
            assert "input_tokens include the cache reads" in report
            true = fake.usage_log[-1]  # what the prompt really cost, each token once
            read, written, uncached = (true[k] for k in ("cache_read_input_tokens", "cache_creation_input_tokens",
                                                         "input_tokens"))
            assert (f"Prompt cache, last request: {100 * read // (read + written + uncached)}% read "
                    f"({terminal.format_tokens(read)} read, {terminal.format_tokens(written)} written, "
                    f"{terminal.format_tokens(uncached)} uncached)") in report, "the reads are not counted twice"


def test_usage_far_below_the_estimate_is_distrusted_and_far_above_kept(s08):
    endpoint = Endpoint(200_000)
    assert endpoint_module.usage_prompt_tokens(endpoint, {"input_tokens": 4_000}, 10_000)[0] is None
    assert "usage distrusted" in endpoint.usage_note
    assert endpoint_module.usage_prompt_tokens(endpoint, {"input_tokens": 50_000}, 10_000)[0] == 50_000
    assert "its count is used" in endpoint.usage_note


def test_cache_reads_inside_input_tokens_are_counted_once(s08):
    kimi = Endpoint(200_000)  # adding the reads would double the size: they were inside
    size, counted = endpoint_module.usage_prompt_tokens(kimi, {"input_tokens": 10_500, "cache_read_input_tokens": 9_000,
                                                   "cache_creation_input_tokens": 300}, 10_000)
    assert (size, counted["input_tokens"]) == (10_800, 1_500) and "counted once" in kimi.usage_note
    anthropic_style = Endpoint(200_000)  # fewer input tokens than reads: they are beside it
    size, counted = endpoint_module.usage_prompt_tokens(anthropic_style, {"input_tokens": 1_500, "cache_read_input_tokens": 9_000},
                                            10_000)
    assert (size, counted["input_tokens"]) == (10_500, 1_500) and anthropic_style.usage_note == ""
    # then a reply where both readings look possible keeps the proven way (50k + 20k, not 50k)
    assert endpoint_module.usage_prompt_tokens(anthropic_style, {"input_tokens": 50_000, "cache_read_input_tokens": 20_000},
                                   59_000)[0] == 70_000
    unknown = Endpoint(200_000)  # and before anything is proven, the larger, safer reading
    assert endpoint_module.usage_prompt_tokens(unknown, {"input_tokens": 50_000, "cache_read_input_tokens": 20_000}, 59_000)[0] \
        == 70_000



def test_a_limit_an_answered_prompt_passes_only_with_its_cache_reads_added_proves_them_inside(s08):
    """Until proven either way the larger reading stands; then a refusal naming a limit that
    the answered prompt fits only with each read counted once settles it, and the window is
    learned. A limit below even that is still one refusal's words against its own count."""
    def answered_then_refused(limit: int) -> tuple:
        endpoint = Endpoint(200_000)
        usage = {"input_tokens": 30_000, "cache_read_input_tokens": 26_000}  # Kimi's: reads inside
        size, counted = endpoint_module.usage_prompt_tokens(endpoint, usage, 40_000)
        assert size == 56_000 and endpoint.reads_in_input is None  # not proven by the estimate
        endpoint.accepted(size, 8_192, measured=True, usage=counted)
        overflow = overflow_module.Overflow("exceeded model token limit", 33_000, limit, True)
        said = endpoint.learn_from(overflow_module.ContextOverflow(overflow, 60_000, 8_192))
        return endpoint, said
    kimi, said = answered_then_refused(32_000)
    assert kimi.window == 32_000 and kimi.reads_in_input is True and kimi.largest_measured == 30_000
    assert "its input_tokens include the cache reads" in said
    contradicted, said = answered_then_refused(20_000)
    assert contradicted.window == 200_000 and contradicted.reads_in_input is None
    assert "it has answered 56,000 by its own count; the window stays 200,000" in said

def test_count_tokens_404_is_asked_once(s08, make_agent):
    with FakeAnthropic(count_tokens_api=False) as fake:
        agent = make_agent(window=20_000, server=fake)
        near = [user("x " * 4 * 5_600)]  # close to the threshold, where an exact count would decide
        for _ in range(3):
            s08.over_threshold(agent, near)
        assert fake.count_token_calls == 1 and agent.endpoint.can_count_tokens is False


# ---------------------------------------------------------------- replies kept exactly

def test_thinking_blocks_go_back_verbatim_in_a_tool_loop(s08, make_agent, workspace):
    (workspace / "a.txt").write_text("alpha")
    with FakeAnthropic(thinking=True) as fake:
        agent = make_agent(server=fake)
        fake.reply(tool_use("read_file", {"path": "a.txt"}), tool_use("read_file", {"path": "a.txt", "offset": 1}),
                   text("done"))
        messages = []
        s08.take_turn(agent, messages, "read a.txt twice")
        assert fake.invalid == [] and "done" in agent.out.text
        thought = blocks(messages[1])[0]
        assert thought["type"] == "thinking" and thought["signature"] and thought["thinking"]
        sent_back = fake.main_requests[1]["messages"][1]["content"][0]
        assert {k: v for k, v in sent_back.items() if k != "cache_control"} == thought


def test_thinking_that_holds_a_secret_goes_back_unchanged_and_is_kept_out_of_the_log(s08, make_agent, workspace):
    """A signed block changed by redaction fails its signature, and every later turn with it:
    it goes back byte for byte (it came from the endpoint); the log and screen never show it."""
    (workspace / "a.txt").write_text("alpha")
    secret = "hunter2-swordfish-77"
    with FakeAnthropic(thinking=True) as fake:
        agent = make_agent(server=fake, secrets=[secret])
        open_session(agent, None)
        thought = {"type": "thinking", "thinking": f"The .env says {secret}; I will not repeat it."}
        fake.reply({"content": [thought, *tool_use("read_file", {"path": "a.txt"})["content"]]}, text("done"),
                   text("and again"))
        messages = []
        assert s08.take_turn(agent, messages, "read a.txt")
        assert s08.take_turn(agent, messages, "once more")
        assert fake.invalid == [], fake.invalid
        assert secret in fake.main_requests[1]["messages"][1]["content"][0]["thinking"]
        assert secret not in agent.out.text
        assert secret not in "".join(p.read_text() for p in (workspace / ".transcripts").glob("*.jsonl"))


def test_redacted_thinking_is_kept_as_sent(s08, make_agent, fake):
    fake.reply({"content": [{"type": "redacted_thinking", "data": "c2VjcmV0"},
                            {"type": "tool_use", "name": "glob", "input": {"pattern": "*"}}]}, text("ok"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "list")
    assert blocks(messages[1])[0] == {"type": "redacted_thinking", "data": "c2VjcmV0"}
    assert fake.main_requests[1]["messages"][1]["content"][0]["data"] == "c2VjcmV0"


def test_kimi_tool_ids_are_echoed_and_kept_unique(s08, make_agent, workspace):
    (workspace / "a.txt").write_text("alpha")
    with FakeAnthropic(tool_ids="kimi") as fake:
        agent = make_agent(server=fake)
        # Kimi numbers calls within a reply, so two replies both call functions.read_file:0
        fake.reply(tool_use("read_file", {"path": "a.txt"}), tool_use("read_file", {"path": "a.txt", "limit": 5}),
                   text("ok"))
        messages = []
        s08.take_turn(agent, messages, "go")
        assert fake.invalid == []
        results = [b["tool_use_id"] for m in messages for b in blocks(m) if b.get("type") == "tool_result"]
        assert results == ["functions.read_file:0", "functions.read_file:0_1"]


@pytest.mark.parametrize("bad_input", ["just a string", ["ls"], 7])
def test_a_tool_input_that_is_not_an_object_is_refused_and_history_stays_valid(s08, make_agent, fake, bad_input):
    fake.reply(tool_use("read_file", bad_input), text("sorry"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "read something")
    assert fake.invalid == []
    call, result = blocks(messages[1])[0], blocks(messages[2])[0]
    assert call["input"] == {} and result["is_error"]
    assert "not a JSON object" in result["content"] and json.dumps(bad_input)[:10] in result["content"]
    assert_valid(messages, "read something")


def test_broken_tool_json_gets_an_error_result(s08, make_agent, fake):
    fake.reply(broken_tool_json("read_file"), text("retrying later"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "read a.py")
    result = blocks(messages[2])[0]
    assert result["is_error"] and "not a JSON object" in result["content"] and '{\\"path\\"' in result["content"]
    assert fake.invalid == [] and "retrying later" in agent.out.text


def test_a_resumed_history_with_a_non_object_input_is_repaired(s08):
    history = [user("go"), {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "bash", "input": "ls"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]
    repaired = log_repair.repair_history(history)
    assert blocks(repaired[1])[0]["input"] == {} and history[1]["content"][0]["input"] == "ls"


# ---------------------------------------------------------------- bad replies are survivable

@pytest.mark.parametrize("bad, said", [
    (malformed("sse_not_json"), "an event that is not JSON"),
    (malformed("empty_body"), "reply was empty"),
    (error_event(), "error inside the reply stream: overloaded_error"),
    (dict(text("partial " * 40), drop_after_block=0), "the reply"),
])
def test_a_bad_reply_is_retried_once_and_the_turn_goes_on(s08, make_agent, fake, bad, said):
    fake.reply(bad, text("recovered"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert f"{said}" in agent.out.text and "retrying in" in agent.out.text
    assert "recovered" in agent.out.text and len(fake.requests) == 2
    assert_valid(messages + [user("next")], "next")


def test_a_json_body_instead_of_a_stream_is_read_as_the_message(s08, make_agent, fake):
    fake.reply(malformed("json_body", reply=text("whole answer")))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert "API error" not in agent.out.text and messages[-1]["content"] == [{"type": "text", "text": "whole answer"}]
    assert "whole answer" in agent.out.text, "the person sees the answer, as a streamed one is shown"


def test_an_error_event_that_will_not_pass_is_reported_once(s08, make_agent, fake):
    fake.reply(error_event("invalid_request_error", "tools.0: something odd"), text("later"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert "API error: error inside the reply stream: invalid_request_error: tools.0: something odd" in agent.out.text
    assert len(fake.requests) == 1, "not retried: the same request would fail the same way"
    s08.take_turn(agent, messages, "again")
    assert "later" in agent.out.text


def test_an_endpoint_that_never_answers_is_abandoned(s08, make_agent, fake):
    agent = make_agent(idle=0.5)
    fake.reply(hang(5), text("finally"))
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert "did not answer in time" in agent.out.text
    assert "finally" in agent.out.text and len(fake.requests) == 2
    wait_until(lambda: fake.stalls == ["client closed"])


@pytest.mark.parametrize("style", ["event", "data", "comment"])
def test_keep_alives_alone_do_not_hold_a_turn(s08, make_agent, fake, style):
    agent = make_agent(idle=0.6)
    fake.reply(pings_only(20, style), text("finally"))
    started = time.monotonic()
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert time.monotonic() - started < 15, "abandoned after the idle timeout, not after the 20 s of keep-alives"
    assert "the endpoint sent nothing but pings or comments for 0.6s" in agent.out.text
    assert "finally" in agent.out.text
    wait_until(lambda: fake.stalls == ["client closed"])


def test_a_reply_that_drips_is_abandoned_and_said_for_what_it_is(s08, make_agent, fake):
    agent = make_agent(idle=0.6)
    fake.reply(drip(0.1), text("finally"))
    s08.take_turn(agent, [], "hello")
    said = agent.out.text
    assert "the endpoint's reply stalled:" in said and "not one whole event" in said and "pings" not in said
    assert "finally" in said
    wait_until(lambda: fake.stalls == ["client closed"])


def test_a_byte_that_is_not_utf8_in_a_stream_is_not_fatal(s08, make_agent, fake):
    fake.reply(malformed("bad_utf8"))
    agent = make_agent()
    messages = []
    s08.take_turn(agent, messages, "hello")
    assert "caf\ufffd ok" in agent.out.text and "API error" not in agent.out.text


@pytest.mark.parametrize("style", ["anthropic", "vllm", "glm", "llamacpp", "413", "minimax", "stop_reason"])
def test_a_prompt_bigger_than_the_real_window_is_refused_only_once(s08, make_agent, style):
    with FakeAnthropic(context_window=6_000, overflow=style) as fake:
        agent = make_agent(window=200_000, server=fake)
        fake.reply(text("read your message from the file"))
        messages = []
        s08.take_turn(agent, messages, "please review this: " + "lorem ipsum dolor " * 1_700)
        assert len(fake.overflows) == 1 and fake.invalid == [], fake.rejections
        assert "API error" not in agent.out.text and "read your message from the file" in agent.out.text
        sent = json.dumps(fake.main_requests[-1])
        assert ".task_outputs/prompts/" in sent and "lorem ipsum dolor " * 20 not in sent


def test_a_big_step_after_small_ones_does_not_collapse_the_window(s08):
    silent = overflow_module.Overflow("Prompt exceeds max length")
    window = overflow_module.learned_window(silent, window=200_000, sent_tokens=25_000, max_tokens=8_192,
                                largest_accepted=(3_000, 11_192))
    assert 3_000 < window < 25_000 and window == int((3_000 * 25_000) ** 0.5)


def test_newer_wordings_with_numbers_are_read(s08, fake):
    fake.reply({"error": {"status": 400, "type": "exceed_context_size_error",
                          "message": "request (66202 tokens) exceeds the available context size (65536 tokens), "
                                     "try increasing it"}},
               {"error": {"status": 400, "type": "invalid_request_error",
                          "message": "This model's maximum context length is 8192 tokens. However, your messages "
                                     "resulted in 9000 tokens. Please reduce the length of the messages."}})
    client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
    found = []
    for _ in range(2):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="m", max_tokens=10, tools=TOOLS, messages=[user("hi")])
        found.append(overflow_module.context_overflow(caught.value))
    assert (found[0].prompt_tokens, found[0].window) == (66_202, 65_536)
    assert (found[1].prompt_tokens, found[1].window) == (9_000, 8_192)


def test_after_a_summary_the_size_is_never_below_what_is_sent(s08, make_agent):
    # this endpoint counts far fewer tokens than the estimate: the anchor is below the estimate
    with FakeAnthropic(chars_per_token=6) as fake:
        agent = make_agent(window=40_000, server=fake)
        messages = [user("tell me " + "about the parser " * 2_000)]
        fake.reply(text("a long answer " * 500))
        s08.agent_loop(agent, messages)
        handle_command(agent, messages, "/compact", s08.LESSON)
        assert s08.context_tokens(agent, messages) >= agent.overhead + estimate_tokens(messages) // 2


def test_a_window_smaller_than_the_program_needs_is_reported_as_the_endpoint_said(s08, make_agent):
    with FakeAnthropic(context_window=400) as fake:
        agent, messages = make_agent(server=fake), []
        s08.take_turn(agent, messages, "hello")
    assert "the endpoint's limit is 400 tokens, below the 4,000 this program needs at least" in agent.out.text
    assert "limit is 4,000 tokens" not in agent.out.text, "never a limit the endpoint did not say"


def test_a_summary_refusal_that_names_a_window_below_what_was_answered_does_not_shrink_it(s08, make_agent):
    """One refusal's words against the endpoint's own count of a request it answered: the
    count wins, and the session keeps its window."""
    with FakeAnthropic(context_window=60_000) as fake:
        agent = make_agent(window=60_000, server=fake)
        messages = chat(6, 6_000) + [user("go on")]
        fake.reply(text("answered"))
        s08.agent_loop(agent, messages)
        usage = fake.usage_log[-1]
        answered = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        assert answered > 8_000
        fake.summary(error(400, "invalid_request_error", "prompt is too long: 30000 tokens > 8000 maximum"),
                     text("<summary>Short.</summary>"))
        handle_command(agent, messages, "/compact", s08.LESSON)
        assert agent.endpoint.window == 60_000 and not agent.endpoint.learned and agent.endpoint.undercount == 1.0
        assert f"the endpoint named a limit of 8,000 tokens, but it has answered {answered:,}" in agent.out.text
