"""What snip cut, summarized later (compaction/snip_summaries.py): a request of its own, a
note joined at the end of the context, and what happens when it fails, is called off, or
meets a secret."""

import json
import threading
from dataclasses import replace

from conftest import assert_valid, of_what_snip_cut, plain
from test_summary_ahead import notes_read
from s08_context_compact.command_line import handle_command
from s08_context_compact.offline.fake_anthropic import error, held, text


def snipped(s08, agent, count: int = 30) -> list:
    """`count` notes read, and the middle of them snipped: a transcript waits."""
    messages = notes_read(count)
    return s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                           store=agent.store, tools=agent.tools)


def test_the_summary_of_what_snip_cut_joins_the_end_and_the_next_summary_does_not_read_it_again(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    fake.summary(text("<summary>Notes 1 to 24 read: each is y, over and over.</summary>"))
    messages = agent.snips.summarized(messages, agent.settings)  # started, and written (the tests wait)
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert len(asked) == 1 and not asked[0].get("tools"), "a request of its own, no tools"
    sent = json.dumps(asked[0]["messages"])
    assert all(f"(call r{k})" in sent for k in range(1, 20)), "every call cut, written out with its id"
    before = messages
    messages = agent.snips.summarized(messages, agent.settings)  # the next pass: joined
    assert messages[:-1] == before[:-1], "every message before the last as it was"
    assert messages[-1]["content"][:-1] == before[-1]["content"], "the last one only gains a block"
    note = messages[-1]["content"][-1]
    assert note["text"].startswith("[Program note: what snip cut earlier") and "Notes 1 to 24 read" in note["text"]
    assert_valid(messages)
    assert "is summarized" in agent.out.text
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "waiting to be summarized" not in agent.out.text
    # a summary of the whole history: the note stands for the part; its transcript is not read back
    fake.summary(text("<summary>All thirty notes read.</summary>"))
    messages = s08.compact_now(agent, messages)
    whole = json.dumps(fake.summary_requests[-1]["messages"])
    assert "Notes 1 to 24 read" in whole and "(call r1)" not in whole
    assert len(fake.summary_requests) == 2


def test_a_failed_summary_of_what_snip_cut_is_said_once_and_the_next_summary_reads_the_part_back(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    fake.summary(error(400, "invalid_request_error", "messages.0.content.0: something odd"))
    for _ in range(3):  # started, failed and said; then never asked again
        messages = agent.snips.summarized(messages, agent.settings)
    assert sum(1 for r in fake.summary_requests if of_what_snip_cut(r)) == 1
    assert agent.out.text.count("the summary of what it cut failed") == 1
    assert "something odd" in agent.out.text and "Traceback" not in agent.out.text
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "What snip cut, waiting to be summarized: 1 transcript" in agent.out.text
    fake.summary(text("<summary>All thirty notes read.</summary>"))
    messages = s08.compact_now(agent, messages)
    assert "(call r1)" in json.dumps(fake.summary_requests[-1]["messages"]), "read back by the next summary"


def test_clear_calls_off_the_summary_being_written_and_a_subagent_writes_none(s08, fake, make_agent):
    agent = make_agent()
    agent.settings = replace(agent.settings, snip_summary_waits=False)  # as in a person's session
    gate = threading.Event()
    fake.summary(held(text("<summary>never used</summary>"), gate=gate))
    messages = agent.snips.summarized(snipped(s08, agent), agent.settings)
    job = agent.snips.job
    assert job is not None and not job.done.is_set()
    handle_command(agent, messages, "/clear", s08.LESSON)
    gate.set()
    job.thread.join(10)
    assert not job.thread.is_alive() and agent.snips.job is None
    assert agent.snips.summarized([], agent.settings) == [] and agent.snips.job is None
    assert agent.subagent().snips.ask is None, "a subagent's snips wait for its next summary"


def test_a_secret_in_what_snip_cut_never_reaches_its_summary_request(s08, fake, make_agent):
    secret = "sk-ant-api03-" + "Q7x" * 20
    agent = make_agent(secrets=[secret])
    messages = notes_read(30)
    messages[4]["content"][0]["content"] = f"note 1: the key is {secret}"
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)
    messages = agent.snips.summarized(messages, agent.settings)
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert asked and "note 1: the key is" in json.dumps(asked[0])
    assert secret[:20] not in json.dumps(fake.requests) and secret[-20:] not in json.dumps(fake.requests)
    assert plain(asked[0]["messages"])[0]["role"] == "user"
