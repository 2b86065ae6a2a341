"""Property tests: random histories and windows through every layer and the whole pipeline.

Each output must keep the invariants, everything removed must be saved, and nothing may
grow. Every layer gets LAYER_EXAMPLES (1,000) examples a run, from seeded random histories
(quick); the whole pipeline gets MAX_EXAMPLES from hypothesis-drawn ones (they shrink)."""

import json
from collections import Counter
import os
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import blocks, invariant_problems, load_code, replace_with_summary
from s08_context_compact.command_line import Agent  # noqa: E402
from s08_context_compact.command_line.user_turns import add_user_text  # noqa: E402
from s08_context_compact.compaction import MAX_CONSECUTIVE_SUMMARY_FAILURES, Settings
from s08_context_compact.endpoint import Endpoint
from s08_context_compact.messages import current_request, estimate_tokens, group_starts, result_text

s08 = load_code()
MAX_EXAMPLES = 50
# per layer, every run; PROPERTY_EXAMPLES=10000 for a deeper run
LAYER_EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "1000"))
SIZES = [3, 40, 150, 1_500, 9_000, 40_000, 250_000, 1_200_000]  # a few bytes to over a megabyte
LAYER_SIZES = [3, 40, 150, 450, 1_500, 9_000, 40_000]  # the megabyte cases run in the pipeline test below
LAYER_WIDTHS = (4, 4, 4, 25)  # most batches have one to four calls, now and then up to 25
LAYER_HISTORIES = dict(sizes=LAYER_SIZES, turns=4, rounds=5, widths=LAYER_WIDTHS)
CHECK = settings(max_examples=MAX_EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LAYER_CHECK = settings(CHECK, max_examples=LAYER_EXAMPLES)

WORDS = ["fix", "parser", "上下文", "压缩", "test", "window", "缓存", "module", "error"]
# a line of one to six words, ASCII, Chinese or mixed; drawn whole, so an example costs few draws
LINES = [" ".join(WORDS[(start + k) % len(WORDS)] for k in range(count)) for start in range(len(WORDS))
         for count in range(1, 7)]


class Drawn:
    """Choices made by hypothesis, one draw each: slow, but failures shrink to a small history."""

    def __init__(self, draw):
        self.draw = draw

    def between(self, low, high):
        return self.draw(st.integers(low, high))

    def pick(self, options):
        return self.draw(st.sampled_from(options))


class Rolled:
    """The same choices from a seeded random.Random: about ten times quicker, for the
    thousand-example runs. A failure names its seed, and `@example` pins the history."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def between(self, low, high):
        return self.rng.randint(low, high)

    def pick(self, options):
        return self.rng.choice(options)


def text_of(dice, size):
    line = dice.pick(LINES)  # drawn whole, so an example costs few choices
    return (line + "\n") * max(1, size // (len(line) + 1))


def build_history(dice, sizes=SIZES, turns=8, rounds=8, widths=(4,)):
    """A valid history ending with a user message: prompts, parallel calls, earlier compaction."""
    messages, ids = [], 0
    if dice.pick([True, False]):  # a history that was compacted before
        messages.append({"role": "user", "content": [
            {"type": "text", "text": "[Compacted: earlier work was summarized.]\n\nEarlier: " + text_of(dice, 200)}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Understood."}]})
    for turn in range(dice.between(1, turns)):
        add_user_text(messages, f"request {turn}: " + text_of(dice, 40))  # joins pending results, as in the program
        steps = dice.between(0, rounds)
        for r in range(steps):
            calls, width = [], dice.pick(widths)
            for _ in range(dice.between(1, width)):
                ids += 1
                calls.append({"type": "tool_use", "id": f"toolu_{ids}", "name": dice.pick(["bash", "read_file"]),
                              "input": {"command": f"step {ids}"}})
            messages.append({"role": "assistant", "content": calls})
            results = []
            for call in calls:
                kind = dice.pick(["fresh"] * 6 + ["placeholder", "persisted"])
                if kind == "placeholder":
                    body = f"[Earlier tool result (bash) cleared to save context. Full output: x/{call['id']}.txt.]"
                elif kind == "persisted":
                    body = f'<persisted-output path="x/{call["id"]}.txt" chars="9">\npreview\n</persisted-output>'
                else:
                    # a wide batch has small results: it is there for many results near the preview size
                    body = text_of(dice, dice.pick(sizes if width <= 4 else [n for n in sizes if n <= 1_500]))
                results.append({"type": "tool_result", "tool_use_id": call["id"], "content": body})
            messages.append({"role": "user", "content": results})
        ends_turn = turn < 5 and dice.pick([True, False])
        if steps == 0 or ends_turn:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "done " + text_of(dice, 60)}]})
    if messages[-1]["role"] == "assistant":
        add_user_text(messages, "the current request: go on")
    return messages


@st.composite
def histories(draw, **shape):
    return build_history(Drawn(draw), **shape)


def rolled_histories(**shape):
    return st.integers(0, 2**32 - 1).map(lambda seed: build_history(Rolled(seed), **shape))


windows = st.sampled_from([8_000, 20_000, 60_000, 200_000])


def saved_texts(folder: Path) -> set:
    """Everything the layers put on disk: tool outputs, and every text inside transcripts."""
    found = set()
    for path in folder.rglob("*"):
        if path.suffix == ".txt":
            found.add(path.read_text(encoding="utf-8", errors="surrogatepass"))
        elif path.suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                for block in blocks(record) if "role" in record else []:
                    found.add(block.get("text") or result_text(block))
    return found


def texts(messages) -> set:
    return {b.get("text") or result_text(b) for m in messages for b in blocks(m)}


def check(before, after, folder, request, may_grow_to=None):
    check_saved(before, after, saved_texts(folder), request, may_grow_to)


def check_saved(before, after, saved, request, may_grow_to=None):
    problems = invariant_problems(after, request)
    assert not problems, problems
    kept = texts(after)
    for text in texts(before) - kept:
        if not text.startswith(("[Earlier tool result", "<persisted-output", "[Compacted", "[Snipped")):
            assert text in saved, f"removed without being saved: {text[:80]!r}"
    if may_grow_to is None:  # the messages both hold, the very same, cancel out
        before, after = without_shared(before, after), without_shared(after, before)
    assert estimate_tokens(after) <= max(estimate_tokens(before), may_grow_to or 0)


def without_shared(messages, other) -> list:
    """messages less those `other` holds too (the same objects, as many times as both do)."""
    shared = Counter(map(id, messages)) & Counter(map(id, other))
    kept = []
    for m in messages:
        if shared[id(m)]:
            shared[id(m)] -= 1
        else:
            kept.append(m)
    return kept


def request_of(messages):
    request = current_request(messages)
    return request["text"] if request else None


layer_params = st.fixed_dictionaries({
    "keep_head": st.integers(1, 5), "keep_tail": st.integers(2, 47), "at_least": st.sampled_from([0, 5, 20]),
    "min_tokens": st.sampled_from([0, 200, 5_000]), "keep_recent": st.integers(0, 3),
    "clear_at_least": st.sampled_from([0, 300, 20_000]), "budget_chars": st.sampled_from([500, 20_000, 200_000]),
})


class MemoryStore:
    """Where a layer saves what it removes, kept in memory: a thousand examples stay quick.
    (The pipeline test below saves to disk, through the program's own savers.)"""

    def __init__(self):
        self.texts = set()

    def save_output(self, tool_use_id, text):
        self.texts.add(text)
        return Path(f"tool-results/{tool_use_id}.txt")

    def save_messages(self, removed, kind, footer=None):
        self.texts |= {b.get("text") or result_text(b) for m in removed for b in blocks(m)}
        return Path(f"transcripts/{kind}.jsonl")


def layer(name, p, store):
    """One cheap layer with drawn parameters (so it acts often), saving into the store."""
    return {
        "tool_result_budget": lambda m: s08.tool_result_budget(m, max_chars=p["budget_chars"], preview_chars=400,
                                                               store=store),
        "snip_compact": lambda m: s08.snip_compact(m, keep_head=p["keep_head"], keep_tail=p["keep_tail"], at_least=p["at_least"],
                                                   min_tokens=p["min_tokens"] or 60, store=store, tools=s08.TOOLS),
        "micro_compact": lambda m: s08.micro_compact(m, keep_recent=p["keep_recent"], min_chars=120,
                                                     clear_at_least=p["clear_at_least"], store=store),
    }[name]


@pytest.mark.parametrize("name", ["tool_result_budget", "snip_compact", "micro_compact"])
@LAYER_CHECK
@given(rolled_histories(**LAYER_HISTORIES), layer_params)
@example(
    history=[{'role': 'user', 'content': [{'type': 'text', 'text': 'request 0: ' + 'fix\n' * 10}]},
             {'role': 'assistant', 'content': [{'type': 'text', 'text': 'done ' + 'fix\n' * 15}]},
             {'role': 'user', 'content': [{'type': 'text', 'text': 'request 1: ' + 'fix\n' * 10}]},
             {'role': 'assistant',
              'content': [{'type': 'tool_use', 'id': 'toolu_1', 'name': 'bash', 'input': {'command': 'step 1'}}]},
             {'role': 'user',
              'content': [{'type': 'tool_result', 'tool_use_id': 'toolu_1', 'content': 'fix\n'}]},
             {'role': 'assistant',
              'content': [{'type': 'tool_use', 'id': 'toolu_2', 'name': 'bash', 'input': {'command': 'step 2'}},
                  {'type': 'tool_use', 'id': 'toolu_3', 'name': 'bash', 'input': {'command': 'step 3'}},
                  {'type': 'tool_use', 'id': 'toolu_4', 'name': 'bash', 'input': {'command': 'step 4'}},
                  {'type': 'tool_use', 'id': 'toolu_5', 'name': 'bash', 'input': {'command': 'step 5'}}]},
             {'role': 'user',
              'content': [{'type': 'tool_result',
                   'tool_use_id': 'toolu_2',
                   'content': '[Earlier tool result (bash) cleared to save context. Full output: x/toolu_2.txt.]'},
                  {'type': 'tool_result', 'tool_use_id': 'toolu_3', 'content': 'fix fix\n' * 187},
                  {'type': 'tool_result', 'tool_use_id': 'toolu_4', 'content': 'fix\n'},
                  {'type': 'tool_result', 'tool_use_id': 'toolu_5', 'content': 'fix\n'}]}],
    params={'keep_head': 3,
        'keep_tail': 2,
        'at_least': 0,
        'min_tokens': 0,
        'keep_recent': 0,
        'clear_at_least': 0,
        'budget_chars': 500},
)  # found by hypothesis: the preview was longer than the result it replaced
def test_each_cheap_layer_keeps_the_invariants(name, history, params):
    before = json.dumps(history)  # the text of the input: cheaper to compare than a deep copy
    store = MemoryStore()
    after = layer(name, params, store)(history)
    assert json.dumps(history) == before, "a layer never edits its input"
    check_saved(history, after, store.texts, request_of(history))


@CHECK
@given(histories(), windows)
def test_the_whole_pipeline_keeps_the_invariants(history, window):
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        agent = Agent(client=None, settings=replace(Settings.for_window("m", window)), workdir=workdir,
                          system="system", tools=s08.TOOLS, out=lambda *a, **k: None,
                          endpoint=Endpoint(window, can_count_tokens=False))
        # no network: the breaker is open, so no summary call
        agent.writer.breaker.failures, agent.writer.breaker.announced = MAX_CONSECUTIVE_SUMMARY_FAILURES, True
        after = s08.compact_pipeline(agent, list(history))
        check(history, after, workdir, request_of(history))
        measure = agent.state.counter.estimate  # estimate_tokens, each message measured once
        if measure(history) + agent.overhead > agent.settings.threshold:
            assert measure(after) + agent.overhead <= agent.settings.threshold


@pytest.mark.parametrize("name", ["compact_history", "reactive_compact"])
@LAYER_CHECK
@given(history=rolled_histories(**LAYER_HISTORIES), window=windows, undercount=st.integers(1, 8),
       summary_size=st.sampled_from([7, 400, 4_000, 40_000]),
       restored_sizes=st.lists(st.sampled_from([50, 2_000, 20_000]), max_size=3))
@example(
    history=[{'role': 'user', 'content': [{'type': 'text', 'text': 'request 0: ' + 'fix\n' * 10}]},
             {'role': 'assistant',
              'content': [{'type': 'tool_use', 'id': 'toolu_1', 'name': 'bash', 'input': {'command': 'step 1'}}]},
             {'role': 'user',
              'content': [{'type': 'tool_result', 'tool_use_id': 'toolu_1', 'content': '上下文\n' * 375}]}],
    window=20000,
    undercount=3,
    summary_size=7,
    restored_sizes=[],
)  # found by hypothesis: the preview was longer than the result it replaced
def test_the_summary_layers_never_grow_and_reactive_fits_its_tail(name, history, window, undercount, summary_size,
                                                                 restored_sizes):
    """Both summary layers save the whole history first, keep the invariants, and never hand back
    a larger history, whatever the summary and the restored context cost; when reactive_compact
    acts, the recent messages it keeps fit the tail it was given."""
    config = Settings.for_window("m", window)
    store = MemoryStore()
    summary = text_of(Rolled(summary_size), summary_size)
    restored = [text_of(Rolled(size), size) for size in restored_sizes]
    tail_tokens = config.threshold // (4 * undercount)
    tail = s08.compact_tail(history) if name == "compact_history" else s08.reactive_tail(history, tail_tokens)
    after = replace_with_summary(s08, history, name.split("_")[0], summary, tail, restored, store=store,
                                     preview_chars=config.preview_chars)
    check_saved(history, after, store.texts, request_of(history))
    if name == "reactive_compact" and after is not history:
        tail = after[1:]  # after the one message of summary, restored context and request
        assert estimate_tokens(tail) <= tail_tokens or len(group_starts(tail)) <= 1, \
            "only the newest group may be kept whole when it alone is over the tail's share"
