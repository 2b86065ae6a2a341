"""The fake API's prompt cache follows the documented rules, one test a rule, through the
real SDK: what the benchmark's figures (and the chapter's) rest on."""

import anthropic
import pytest

from s08_context_compact.offline.fake_anthropic import CACHE_LOOKBACK_BLOCKS, FakeAnthropic

MARK = {"type": "ephemeral"}
TOOLS = [{"name": "bash", "description": "run " * 300, "input_schema": {"type": "object", "properties": {}}}]
SYSTEM = [{"type": "text", "text": "You are careful. " * 400, "cache_control": MARK}]


class Clock:
    """The cache's time, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def api(clock):
    with FakeAnthropic(clock=clock) as fake:
        client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)

        def send(messages, **extra):
            client.messages.create(model=extra.pop("model", "claude-test"), max_tokens=100,
                                   system=extra.pop("system", SYSTEM), tools=extra.pop("tools", TOOLS),
                                   messages=messages, **extra)
            return fake.usage_log[-1]
        send.fake = fake
        yield send


def turns(count, marked=(-1,), size=600):
    """A conversation of text turns, ending with the user; cache marks on the given messages."""
    messages = []
    for n in range(count):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"question {n} " + "q" * size}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {n} " + "a" * size}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": "and now?"}]})
    for index in marked:
        messages[index]["content"][-1]["cache_control"] = MARK
    return messages


def sent(usage) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]


def test_a_prefix_written_at_a_breakpoint_is_read_by_the_next_request(api):
    first = api(turns(5))
    assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] == sent(first)
    second = api(turns(5))
    assert second["cache_read_input_tokens"] == sent(second) and second["cache_creation_input_tokens"] == 0


def test_a_changed_message_reads_only_the_prefix_before_it(api):
    api(turns(5))
    changed = turns(5)
    changed[6]["content"][0]["text"] = "an edited question"
    usage = api(changed)
    assert 0 < usage["cache_read_input_tokens"] < sent(usage), "tools and system (and messages 0-5) are still read"


def test_the_lookback_finds_a_hit_at_most_20_blocks_before_a_breakpoint(api):
    api(turns(2))  # writes a prefix ending at message 4
    near = turns(2 + (CACHE_LOOKBACK_BLOCKS - 2) // 2)
    assert api(near)["cache_read_input_tokens"] > 0
    far = turns(2 + (CACHE_LOOKBACK_BLOCKS + 4) // 2, marked=(-1,))
    api.fake.usage_log.clear()
    assert api(far)["cache_read_input_tokens"] < sent(api.fake.usage_log[-1]) - 1000


def test_more_than_four_breakpoints_is_refused(api):
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
        api(turns(3, marked=(0, 1, 2, 3, 4)))


@pytest.mark.parametrize("model, minimum", [("claude-sonnet-4-6", 1024), ("claude-haiku-4-5", 4096),
                                            ("claude-3-haiku-test", 2048)])
def test_a_prefix_shorter_than_the_models_minimum_is_not_cached(clock, model, minimum):
    with FakeAnthropic(clock=clock) as fake:
        client = anthropic.Anthropic(api_key="test", base_url=fake.url, max_retries=0)
        for size in (minimum - 300, minimum + 300):
            body = [{"role": "user", "content": [{"type": "text", "text": "w " * size, "cache_control": MARK}]}]
            for _ in range(2):
                client.messages.create(model=model, max_tokens=10, messages=body)
            cached = fake.usage_log[-1]["cache_read_input_tokens"] > 0
            assert cached == (sent(fake.usage_log[-1]) >= minimum), (model, size)


def test_entries_expire_after_five_minutes_and_each_read_renews_them(api, clock):
    api(turns(4))
    clock.now += 290
    assert api(turns(4))["cache_read_input_tokens"] > 0, "read at 4m50s: still there, and renewed"
    clock.now += 290
    assert api(turns(4))["cache_read_input_tokens"] > 0, "the read renewed it"
    clock.now += 301
    assert api(turns(4))["cache_read_input_tokens"] == 0, "five minutes with no read: gone"


def test_the_one_hour_option_lives_an_hour_and_bills_its_writes_apart(api, clock):
    messages = turns(4)
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    first = api(messages)
    assert first["cache_creation"]["ephemeral_1h_input_tokens"] > 0
    clock.now += 50 * 60
    assert api(messages)["cache_read_input_tokens"] > 0


@pytest.mark.parametrize("change", [{"tool_choice": {"type": "any"}},
                                    {"thinking": {"type": "enabled", "budget_tokens": 2000}}])
def test_tool_choice_and_thinking_changes_invalidate_the_messages_only(api, change):
    api(turns(4))
    before = api(turns(4))["cache_read_input_tokens"]
    after = api(turns(4), **change)
    assert 0 < after["cache_read_input_tokens"] < before, "tools and system are read; the messages are not"


def test_an_image_invalidates_the_messages_only(api):
    api(turns(4))
    with_image = turns(4)
    with_image[-1]["content"].insert(0, {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "iVBORw0KGgo="}})
    usage = api(with_image)
    assert usage["cache_read_input_tokens"] > 0 and usage["cache_creation_input_tokens"] > 1000, \
        "tools and system are read; the messages (over 1,000 tokens) are written again"


def test_a_changed_tool_definition_invalidates_everything(api):
    api(turns(4))
    other = [dict(TOOLS[0], description="changed " * 300)]
    assert api(turns(4), tools=other)["cache_read_input_tokens"] == 0


def test_a_request_without_marks_is_neither_read_nor_written(api):
    plain_system = [{"type": "text", "text": SYSTEM[0]["text"]}]
    for _ in range(2):
        api.fake.usage_log.clear()
        usage = api(turns(4, marked=()), system=plain_system)
        assert usage["cache_read_input_tokens"] == usage["cache_creation_input_tokens"] == 0
