"""What snip cut, summarized later (compaction/snip_summaries.py): a request of its own, a
note joined at the end of the context, and what happens when it fails, is called off, or
meets a secret."""

import json
import threading
from dataclasses import replace

from conftest import assert_valid, of_what_snip_cut, plain, wait_until
from test_summary_ahead import notes_read, read_pair
from s08_context_compact.command_line import handle_command
from s08_context_compact.offline.fake_anthropic import error, held, text, tool_use
from s08_context_compact.messages import OWN, snips_pending


def passed(agent, messages: list) -> list:
    """What one pass of the loop does with the history: a summary that is ready joins at the
    end (the pipeline), and the next is started (after the summary ahead)."""
    messages = agent.snips.joined(messages)
    agent.snips.summarize(messages, agent.settings, 0)  # below the mark: nothing summarized ahead
    return messages


def snipped(s08, agent, count: int = 30) -> list:
    """`count` notes read, and the middle of them snipped: a transcript waits."""
    messages = notes_read(count)
    return s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                           store=agent.store, tools=agent.tools)


def test_the_summary_of_what_snip_cut_joins_the_end_and_the_next_summary_does_not_read_it_again(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    fake.summary(text("<summary>Notes 1 to 24 read: each is y, over and over.</summary>"))
    messages = passed(agent, messages)  # started, and written (the tests wait)
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert len(asked) == 1 and not asked[0].get("tools"), "a request of its own, no tools"
    sent = json.dumps(asked[0]["messages"])
    assert all(f"(call r{k}):" in sent for k in range(1, 20)), "every call cut, written out with its id"
    before = messages
    messages = passed(agent, messages)  # the next pass: joined
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
    assert "Notes 1 to 24 read" in whole and "(call r1):" not in whole
    assert len(fake.summary_requests) == 2


def test_a_failed_summary_of_what_snip_cut_is_said_once_and_the_next_summary_reads_the_part_back(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    fake.summary(error(400, "invalid_request_error", "messages.0.content.0: something odd"))
    for _ in range(3):  # started, failed and said; then never asked again
        messages = passed(agent, messages)
    assert sum(1 for r in fake.summary_requests if of_what_snip_cut(r)) == 1
    assert agent.out.text.count("the summary of what it cut failed") == 1
    assert "400 invalid_request_error: messages.0.content.0: something odd" in agent.out.text
    assert "Error code" not in agent.out.text and "Traceback" not in agent.out.text
    handle_command(agent, messages, "/context", s08.LESSON)
    assert ("What snip cut, waiting to be summarized: 1 transcript; the next summary of the history "
            "reads it back") in agent.out.text
    fake.summary(text("<summary>All thirty notes read.</summary>"))
    messages = s08.compact_now(agent, messages)
    assert "(call r1):" in json.dumps(fake.summary_requests[-1]["messages"]), "read back by the next summary"


def test_clear_calls_off_the_summary_being_written_and_a_subagent_writes_none(s08, fake, make_agent):
    agent = make_agent()
    agent.settings = replace(agent.settings, snip_summary_waits=False)  # as in a person's session
    gate = threading.Event()
    fake.summary(held(text("<summary>never used</summary>"), gate=gate))
    messages = passed(agent, snipped(s08, agent))
    job = agent.snips.job
    assert job is not None and not job.done.is_set()
    handle_command(agent, messages, "/clear", s08.LESSON)
    gate.set()
    job.thread.join(10)
    assert not job.thread.is_alive() and agent.snips.job is None
    assert passed(agent, []) == [] and agent.snips.job is None
    assert agent.subagent().snips.ask is None, "a subagent's snips wait for its next summary"


def test_a_secret_in_what_snip_cut_never_reaches_its_summary_request(s08, fake, make_agent):
    secret = "sk-ant-api03-" + "Q7x" * 20
    agent = make_agent(secrets=[secret])
    messages = notes_read(30)
    messages[4]["content"][0]["content"] = f"note 1: the key is {secret}"
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)
    messages = passed(agent, messages)
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert asked and "note 1: the key is" in json.dumps(asked[0])
    assert secret[:20] not in json.dumps(fake.requests) and secret[-20:] not in json.dumps(fake.requests)
    assert plain(asked[0]["messages"])[0]["role"] == "user"


def test_a_summary_cut_by_a_later_snip_still_covers_its_part_through_the_next_one(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    fake.summary(text("<summary>Part A: notes 1 to 19.</summary>"))
    for _ in range(2):  # written, then joined at the end
        messages = passed(agent, messages)
    first = messages[-1]["content"][-1]["covers"]
    for k in range(30, 60):  # more reads; the next snip cuts the message that holds part A's note
        messages += read_pair(f"r{k}", f"note {k} " + "y" * 2_000)
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)
    head = json.dumps(messages[2])  # the snip's note, and part A's summary beside it: still in view
    assert "Part A: notes 1 to 19." in head and head.index("[Snipped") < head.index("Part A")
    fake.summary(text("<summary>Part B, and part A before it.</summary>"))
    for _ in range(2):
        messages = passed(agent, messages)
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert len(asked) == 2 and "Part A: notes 1 to 19." in json.dumps(asked[1]), "part A's note, written out whole"
    second = messages[-1]["content"][-1]["covers"]
    assert set(first) < set(second) and len(second) == 2, "the new note stands for both parts"
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "waiting to be summarized" not in agent.out.text
    fake.summary(text("<summary>All of it.</summary>"))
    messages = s08.compact_now(agent, messages)
    whole = json.dumps(fake.summary_requests[-1]["messages"])
    assert "Part B, and part A" in whole and "(call r1):" not in whole and "(call r35):" not in whole


def test_a_note_a_later_snip_cuts_stays_in_view_until_a_newer_one_stands_for_it(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    fake.summary(text("<summary>Part A.</summary>"), text("<summary>Part B, with A.</summary>"))
    messages = passed(agent, passed(agent, messages))  # A's note joins the end
    for start in (30, 60):  # two more snips: B's cuts A's note, C's cuts B's
        for k in range(start, start + 30):
            messages += read_pair(f"r{k}", f"note {k} " + "y" * 2_000)
        messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10,
                                   at_least=20, store=agent.store, tools=agent.tools)
        if start == 30:
            assert "Part A." in json.dumps(messages[:3]), "moved into the head with the snip's note"
            messages = passed(agent, passed(agent, messages))  # B's note joins; it stands for A too
    head = json.dumps(messages[:3])
    assert "Part B, with A." in head and "Part A." not in head, "A's note: B's stands for it"
    assert_valid(messages)


def test_a_ready_summary_joins_before_the_history_is_summarized_and_none_starts_then(s08, fake, make_agent):
    agent = make_agent(window=30_000)
    agent.settings = replace(agent.settings, micro_trigger=10**9)  # the cheap layers stay out of it
    messages = snipped(s08, agent)
    fake.summary(text("<summary>Part A: notes 1 to 19.</summary>"))
    messages = passed(agent, messages)  # written; joined at the next pass
    for k in range(30, 90):
        messages += read_pair(f"r{k}", f"note {k} " + "y" * 2_000)
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=70, at_least=20,
                               store=agent.store, tools=agent.tools)  # a part more waits
    assert s08.over_threshold(agent, messages)
    fake.summary(text("<summary>All of it.</summary>"))
    messages = s08.compact_pipeline(agent, messages)
    assert sum(1 for r in fake.summary_requests if of_what_snip_cut(r)) == 1, "none started: the history's is due"
    whole = json.dumps(fake.summary_requests[-1]["messages"])
    assert "Part A: notes 1 to 19." in whole and "(call r1):" not in whole, "part A by its note"
    assert "(call r35):" in whole, "the part that waited, read back"
    assert_valid(messages)


def test_a_part_too_big_for_one_request_is_summarized_from_its_start_and_read_back_whole_later(s08, fake, make_agent):
    agent = make_agent()
    messages = notes_read(120)
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)
    agent.settings = agent.settings.resized(5_000)  # the endpoint's window turned out smaller
    fake.summary(text("<summary>The first notes.</summary>"))
    for _ in range(2):
        messages = passed(agent, messages)
    note = messages[-1]["content"][-1]
    assert "the start of what snip cut" in note["text"] and note["covers"] == []
    asked = json.dumps([r for r in fake.summary_requests if of_what_snip_cut(r)][0])
    assert "the rest of this part is in" in asked
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "What snip cut, waiting to be summarized: 1 transcript" in agent.out.text
    assert sum(1 for r in fake.summary_requests if of_what_snip_cut(r)) == 1, "not asked again"


def test_the_picture_says_when_each_snip_was_summarized_and_which_wait():
    from s08_context_compact.command_line.session_picture import Session, snip_fates
    joined = "summarizing what snip cut: joined, for "
    session = Session(layers=[(4, {"layer": "snip_compact", "saved_to": [".transcripts/snip-a.jsonl"]}),
                              (7, {"layer": "snip_compact", "saved_to": [".transcripts/snip-b.jsonl"]}),
                              (11, {"layer": "snip_compact", "saved_to": [".transcripts/snip-c.jsonl"]}),
                              (15, {"layer": "snip_compact", "saved_to": [".transcripts/snip-d.jsonl"]}),
                              (17, {"layer": "compact_history", "saved_to": []})],
                      summaries=[(6, {"what": "summarizing what snip cut: failed (empty), for snip-a.jsonl"}),
                                 (8, {"what": joined + "snip-b.jsonl"}),
                                 (12, {"what": joined + "snip-a.jsonl snip-c.jsonl"})])
    assert snip_fates(session) == {
        0: "summarized in the background, in view from call 13",
        1: "summarized in the background, in view from call 9",
        2: "summarized in the background, in view from call 13",
        3: "summarized with the whole history before call 18"}
    waiting = Session(layers=[(3, {"layer": "snip_compact", "saved_to": ["x/snip-e.jsonl"]}),
                              (5, {"layer": "snip_compact", "saved_to": ["x/snip-f.jsonl"]})],
                      summaries=[(6, {"what": "summarizing what snip cut: failed (500 api_error: boom), for snip-f.jsonl"})])
    assert snip_fates(waiting) == {0: "waiting to be summarized where the log ends",
                                   1: "its summary failed; waiting for the next summary of the history"}
    # a summary built without the model reads nothing back; /clear drops what was waiting
    later = Session(layers=[(3, {"layer": "snip_compact", "saved_to": ["x/snip-g.jsonl"]}),
                            (5, {"layer": "compact_history", "saved_to": ["x/compact-1.jsonl"]}),
                            (6, {"layer": "snip_compact", "saved_to": ["x/snip-h.jsonl"]}),
                            (9, {"layer": "compact_history", "saved_to": ["x/compact-2.jsonl"]})],
                    clears=[8])
    assert snip_fates(later, {1: "fallback", 3: "the model"}) == {
        0: "not summarized: the summary before call 6 was built without the model; its transcript keeps it",
        2: "dropped by /clear before call 9; its transcript keeps it"}


def test_a_part_the_summary_written_ahead_reads_gets_no_summary_of_its_own_one_cut_after_it_does(s08, fake, make_agent):
    from test_summary_ahead import start_now
    agent = make_agent()
    gate = threading.Event()
    fake.summary(held(text("<summary>The history, part A read back.</summary>"), gate=gate),
                 text("<summary>Part B.</summary>"))
    messages = snipped(s08, agent)  # part A waits
    start_now(s08, agent, messages)  # a summary ahead starts, and reads part A back
    wait_until(lambda: len(fake.summary_requests) == 1)  # and is held at the server
    messages = passed(agent, messages)
    assert agent.snips.job is None, "part A: the summary being written ahead reads it"
    for k in range(30, 60):
        messages += read_pair(f"r{k}", f"note {k} " + "y" * 2_000)
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)  # part B, after its snapshot
    messages = passed(agent, messages)
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert len(asked) == 1 and "(call r35):" in json.dumps(asked[0]) and "(call r5):" not in json.dumps(asked[0])
    gate.set()
    agent.ahead.drop("the test is over")


def test_a_summary_of_what_snip_cut_is_not_retried_and_a_tool_call_is_no_summary(s08, fake, make_agent):
    """A failed part waits for the history's summary, which reads it back: retried, a hung
    endpoint would keep it out of view as long again for each retry."""
    agent = make_agent()
    fake.summary(error(500, "api_error", "boom"))  # retried, the next would be answered
    messages = passed(agent, snipped(s08, agent))
    messages = passed(agent, messages)
    assert len(fake.summary_requests) == 1 and "[api]" not in agent.out.text
    assert "the summary of what it cut failed (500 api_error: boom)" in agent.out.text
    other = make_agent()
    fake.summary(tool_use("bash", {"command": "ls"}))
    messages = passed(other, passed(other, snipped(s08, other)))
    assert "the reply called a tool instead of writing the summary" in other.out.text
    assert "Program note" not in json.dumps(messages)


def test_the_head_keeps_few_notes_however_many_summaries_fail_between_snips(s08, fake, make_agent):
    """Each summary takes in the notes in view, and so stands for them: whether the summaries
    between fail or not, a snip leaves at most the newest note and the one it moved."""
    agent = make_agent()
    messages = notes_read(3)
    for n in range(8):
        for k in range(30 * n, 30 * n + 30):
            messages += read_pair(f"s{k}", f"note {k} " + "y" * 2_000)
        messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10,
                                   at_least=20, store=agent.store, tools=agent.tools)
        fake.summary(text(f"<summary>Part {n}.</summary>") if n % 2 == 0 else error(500, "api_error", "boom"))
        messages = passed(agent, passed(agent, messages))
        notes = [b for m in messages[:3] for b in m["content"] if b.get("_s08") == "snip_summary"]
        assert len(notes) <= 2, [b["text"][-12:] for b in notes]
    assert_valid(messages)
    asked = [json.dumps(r) for r in fake.summary_requests if of_what_snip_cut(r)]
    assert all(request.count(f"Part {n}.") <= 1 for request in asked for n in range(8)), "no note twice"


def ahead_of_the_snip(agent, count: int = 30) -> list:
    """`count` notes read, at a window where they pass snip's trigger; snip keeps the first 3
    and the newest 10, and cuts 20 at least, whatever their tokens."""
    agent.settings = replace(agent.settings, snip_keep_head=3, snip_keep_tail=10, snip_at_least=20,
                             snip_min_tokens=0)
    return notes_read(count)


def test_the_part_the_next_snip_cuts_is_summarized_ahead_and_joins_with_the_snip_that_cuts_it(s08, fake, make_agent):
    """Near snip's trigger the part it will cut is summarized from the history; the work goes
    on; the snip cuts that part and no more, and its summary joins in that same pass, standing
    for the transcript: no call leaves view, and no summary reads the part again."""
    agent = make_agent(window=30_000)
    messages = ahead_of_the_snip(agent)
    fake.summary(text("<summary>Notes 1 to 24 read: each is y, over and over.</summary>"))
    agent.snips.summarize(messages, agent.settings, agent.settings.micro_trigger)  # past its mark
    asked = [r for r in fake.summary_requests if of_what_snip_cut(r)]
    assert len(asked) == 1 and "[48 messages snip cut, written out:]" in json.dumps(asked[0])
    handle_command(agent, messages, "/context", s08.LESSON)
    assert "What the next snip will cut (48 messages): summarized, to join when it is cut" in agent.out.text
    messages = messages + read_pair("r30", "note 30 " + "y" * 2_000)  # the tail moves on
    assert s08.context_tokens(agent, messages) > agent.settings.micro_trigger
    after = s08.compact_pipeline(agent, messages)
    [path] = list(agent.workdir.glob(".transcripts/snip-*.jsonl"))
    assert len(agent.store.read_back(path.relative_to(agent.workdir).as_posix())) == 48, \
        "the snip cut the part summarized, not the 50 it would have cut"
    note = after[-1]["content"][-1]
    assert note["text"].startswith("[Program note: what snip cut earlier (48 messages")
    assert "Notes 1 to 24 read" in note["text"] and note["covers"] == [f".transcripts/{path.name}"]
    assert_valid(after)
    agent.snips.summarize(after, agent.settings, 0)
    assert len(fake.summary_requests) == 1, "nothing waits: the part is not summarized again"
    fake.summary(text("<summary>All thirty-one notes read.</summary>"))
    whole = json.dumps(s08.compact_now(agent, after) and fake.summary_requests[-1]["messages"])
    assert "Notes 1 to 24 read" in whole and "(call r1):" not in whole, "the note stands for the part"


def test_a_part_summarized_ahead_goes_another_way_and_its_summary_is_set_aside_or_stands_for_its_start(s08, fake, make_agent):
    """Summarized with the history before any snip cut it, the part's summary is set aside
    (and paid for); cut with more than was summarized, it stands for the start of the part,
    which the next summary of the history reads back whole."""
    agent = make_agent(window=30_000)
    messages = ahead_of_the_snip(agent)
    fake.summary(text("<summary>Notes read.</summary>"))
    agent.snips.summarize(messages, agent.settings, agent.settings.micro_trigger)
    fake.summary(text("<summary>All thirty notes read.</summary>"))
    messages = s08.compact_now(agent, messages)
    assert agent.snips.joined(messages) is messages and agent.snips.job is None
    assert [label for _, label in agent.snips.bills()] == \
        ["summarizing what snip cut: set aside: what it summarized went another way"]

    agent = make_agent(window=30_000)
    messages = ahead_of_the_snip(agent)
    fake.summary(text("<summary>Notes 1 to 24 read.</summary>"))
    agent.snips.summarize(messages, agent.settings, agent.settings.micro_trigger)
    messages = messages + read_pair("r30", "note 30 " + "y" * 2_000)
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)  # not as it was summarized
    messages = agent.snips.joined(messages)
    note = messages[-1]["content"][-1]
    assert note["text"].startswith("[Program note: the start of what snip cut earlier (48 messages")
    assert note["covers"] == []
    fake.summary(text("<summary>All thirty-one notes read.</summary>"))
    s08.compact_now(agent, messages)
    assert "(call r1):" in json.dumps(fake.summary_requests[-1]["messages"]), "the part read back whole"


def test_a_part_summarized_ahead_is_never_credited_with_a_transcript_holding_other_messages(s08, fake, make_agent):
    """/compact swaps in a summary written ahead before the part summarized ahead is cut, and
    the swap's own snip (kept_after) cuts other messages, as many: the part's summary is set
    aside, not joined as theirs, and their transcript waits for a summary that reads it."""
    from test_summary_ahead import EARLY, start_now
    agent = make_agent(window=30_000)
    agent.settings = replace(agent.settings, summary_ahead=EARLY, snip_keep_head=3, snip_keep_tail=10,
                             snip_at_least=20, snip_min_tokens=0)
    messages = notes_read(30)
    fake.summary(text("<summary>HISTORY: notes 0 to 29 read.</summary>"))
    start_now(s08, agent, messages)  # the history's summary, written ahead
    wait_until(lambda: agent.ahead.job.done.is_set())
    for k in range(30, 60):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"w{k}", "name": "write_file",
                      "input": {"path": f"out/f{k}.txt", "content": f"file {k} " + "x" * 2_000}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"w{k}", "content": "written"}]}]
    agent.settings = replace(agent.settings, snip_keep_tail=94)  # a part as long as the swap's cut
    fake.summary(text("<summary>PART-X: notes 1 to 12 read.</summary>"))
    agent.snips.summarize(messages, agent.settings, agent.settings.micro_trigger)  # part X, ahead
    agent.settings = replace(agent.settings, snip_keep_tail=10)
    messages = s08.compact_now(agent, messages)  # the summary ahead swapped in; kept_after snips
    [cut] = snips_pending(messages)
    assert len(agent.store.read_back(cut)) == 24 and agent.snips.job.about[2] == 24
    after = agent.snips.joined(messages)
    joined = [b for m in after for b in m["content"] if isinstance(b, dict) and b.get("text", "").startswith("[Program note")]
    assert not joined and len(after) == len(messages) and agent.snips.job is None, "part X's summary is set aside"
    assert [label for _, label in agent.snips.bills()] == \
        ["summarizing what snip cut: set aside: what it summarized went another way"]
    fake.summary(text("<summary>Files 31 to 42 written.</summary>"))
    agent.snips.summarize(messages, agent.settings, 0)  # the swap's cut: a summary of its own
    sent = json.dumps(fake.summary_requests[-1]["messages"])
    assert of_what_snip_cut(fake.summary_requests[-1]) and "file 31" in sent and "PART-X" not in sent


def snip_note_sent(fake) -> str:
    """The snip's note in the last request the model got."""
    return next(b["text"] for m in fake.main_requests[-1]["messages"] for b in m["content"]
                if isinstance(b, dict) and b.get("text", "").startswith("[Snipped"))


def snipping_agent(make_agent, **settings):
    agent = make_agent(window=24_000)
    agent.settings = replace(agent.settings, snip_keep_head=3, snip_keep_tail=10, snip_at_least=20,
                             snip_min_tokens=0, **settings)
    return agent


def test_a_snip_with_no_summary_ahead_in_flight_says_what_its_calls_did_not_each_call(s08, fake, make_agent):
    """Its part's own summary comes within a few steps: the note says what the calls did, and
    the list of each never reaches a request (it would only be carried, at a price)."""
    agent = snipping_agent(make_agent)
    messages = notes_read(30)
    agent.snips.summarize(messages, agent.settings, 0)  # a pass ended, nothing cut
    messages = s08.compact_pipeline(agent, messages)
    assert snips_pending(messages), "snipped"
    fake.reply(text("carry on"))
    s08.call_model(agent, messages)
    note = snip_note_sent(fake)
    assert "\nread: 16 more, then r17.md, " in note and "(call r20)" not in note


def test_while_a_summary_ahead_is_in_flight_a_snips_note_lists_each_call_until_the_swap(s08, fake, make_agent):
    """The part snip cuts is in the snapshot of the summary being written ahead: it gets no
    summary of its own, so until that one is swapped in the note lists each call it cut,
    with its id. The swap replaces the head, the list with it."""
    from test_summary_ahead import EARLY, start_now
    agent = snipping_agent(make_agent, summary_ahead=EARLY)
    messages = notes_read(30)
    gate = threading.Event()
    fake.summary(held(text("<summary>AHEAD: notes 0 to 29 read.</summary>"), gate))
    start_now(s08, agent, messages)
    agent.snips.summarize(messages, agent.settings, 0)
    messages = s08.compact_pipeline(agent, messages)
    cut = [b["id"] for m in agent.store.read_back(snips_pending(messages)[-1]) for b in m["content"]
           if b.get("type") == "tool_use"]
    fake.reply(text("carry on"))
    s08.call_model(agent, messages)
    note = snip_note_sent(fake)
    assert len(cut) >= 10 and all(f"\n- read_file {name}.md (call {name})" in note for name in cut)
    gate.set()
    messages = s08.compact_now(agent, messages)
    sent = json.dumps(messages)
    assert "AHEAD: notes 0 to 29 read." in sent and f"(call {cut[0]})" not in sent
    assert_valid(messages)


def test_a_result_cleared_before_the_snip_is_written_out_as_where_it_is_saved_not_as_its_pointer(s08, fake, make_agent):
    agent = make_agent()
    messages = s08.apply_layer(agent, s08.micro_compact, notes_read(30), keep_recent=1, min_chars=120,
                               clear_at_least=0, store=agent.store)
    cleared = [b for m in messages for b in m["content"] if b.get(OWN) == "placeholder"]
    assert len(cleared) == 29
    messages = s08.apply_layer(agent, s08.snip_compact, messages, keep_head=3, keep_tail=10, at_least=20,
                               store=agent.store, tools=agent.tools)
    passed(agent, messages)
    sent = json.dumps([r for r in fake.summary_requests if of_what_snip_cut(r)][0]["messages"])
    assert "cleared to save context" not in sent, "the pointer's words cost tokens and say nothing"
    saved = next(b["saved_at"] for b in cleared if b["tool_use_id"] == "r5")
    assert f"result of r5: cleared, saved in {saved}" in sent and "(call r5):" in sent


def test_a_cleared_results_saved_at_read_back_from_a_changed_transcript_is_cut_like_any_text():
    from s08_context_compact.messages.history import written_out
    pointer = "[Earlier tool result (bash) cleared to save context. Full output: a.txt.]"
    block = {"type": "tool_result", "tool_use_id": "r1", "content": pointer, OWN: "placeholder"}
    assert len(written_out({**block, "saved_at": "x" * 2_000_000}, 300)) < 400, "no line bigger than a head"
    for odd in ("", "  ", ["a.txt"], 7):  # not a path: the pointer's own words, as any result
        assert written_out({**block, "saved_at": odd}, 300) == f"  result of r1: {pointer}"


def test_a_summary_built_without_the_model_names_what_snip_cut_that_it_could_not_summarize(s08, fake, make_agent):
    agent = make_agent()
    messages = snipped(s08, agent)
    path = snips_pending(messages)[0]
    odd = error(400, "invalid_request_error", "messages.0.content.0: something odd")  # not retried
    fake.summary(odd, odd)
    messages = s08.compact_now(agent, messages)
    summary = messages[0]["content"][0]["text"]
    assert "Assembled without the model" in summary
    assert f"What snip cut and this summary could not summarize is saved in: {path}" in summary
