"""Property tests: random histories and windows through every layer and the whole pipeline.

Each output must keep the invariants, everything removed must be saved, and nothing may
grow. Example counts are set per test (MAX_EXAMPLES, LAYER_EXAMPLES) to keep the suite quick."""

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import blocks, invariant_problems, load_code

s08 = load_code()
MAX_EXAMPLES = 75
# per cheap layer, every run (about 5 s a layer on one core); PROPERTY_EXAMPLES=1000 or more for a deeper run
LAYER_EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "500"))
SIZES = [3, 40, 150, 1_500, 9_000, 40_000, 250_000, 1_200_000]  # a few bytes to over a megabyte
LAYER_SIZES = [3, 40, 150, 1_500, 9_000, 40_000]  # the megabyte cases run in the pipeline test below
CHECK = settings(max_examples=MAX_EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LAYER_CHECK = settings(CHECK, max_examples=LAYER_EXAMPLES)

WORDS = ["fix", "parser", "上下文", "压缩", "test", "window", "缓存", "module", "error"]
# a line of one to six words, ASCII, Chinese or mixed; drawn whole, so an example costs few draws
LINES = [" ".join(WORDS[(start + k) % len(WORDS)] for k in range(count)) for start in range(len(WORDS))
         for count in range(1, 7)]


@st.composite
def text_of(draw, size):
    line = draw(st.sampled_from(LINES))
    return (line + "\n") * max(1, size // (len(line) + 1))


@st.composite
def histories(draw, sizes=SIZES, turns=8, rounds=8):
    """A valid history ending with a user message: prompts, parallel calls, earlier compaction."""
    messages, ids = [], 0
    if draw(st.booleans()):  # a history that was compacted before
        messages.append({"role": "user", "content": [
            {"type": "text", "text": "[Compacted: earlier work was summarized.]\n\nEarlier: " + draw(text_of(200))}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Understood."}]})
    for turn in range(draw(st.integers(1, turns))):
        s08.add_user_text(messages, f"request {turn}: " + draw(text_of(40)))  # joins pending results, as in the program
        steps = draw(st.integers(0, rounds))
        for r in range(steps):
            calls = []
            for _ in range(draw(st.integers(1, 4))):
                ids += 1
                calls.append({"type": "tool_use", "id": f"toolu_{ids}", "name": draw(st.sampled_from(["bash", "read_file"])),
                              "input": {"command": f"step {ids}"}})
            messages.append({"role": "assistant", "content": calls})
            results = []
            for call in calls:
                kind = draw(st.sampled_from(["fresh"] * 6 + ["placeholder", "persisted"]))
                if kind == "placeholder":
                    body = f"[Earlier tool result (bash) cleared to save context. Full output: x/{call['id']}.txt.]"
                elif kind == "persisted":
                    body = f'<persisted-output path="x/{call["id"]}.txt" chars="9">\npreview\n</persisted-output>'
                else:
                    body = draw(text_of(draw(st.sampled_from(sizes))))
                results.append({"type": "tool_result", "tool_use_id": call["id"], "content": body})
            messages.append({"role": "user", "content": results})
        ends_turn = turn < 5 and draw(st.booleans())
        if steps == 0 or ends_turn:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "done " + draw(text_of(60))}]})
    if messages[-1]["role"] == "assistant":
        s08.add_user_text(messages, "the current request: go on")
    return messages


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
                    found.add(block.get("text") or s08.result_text(block))
    return found


def texts(messages) -> set:
    return {b.get("text") or s08.result_text(b) for m in messages for b in blocks(m)}


def check(before, after, folder, request, may_grow_to=None):
    check_saved(before, after, saved_texts(folder), request, may_grow_to)


def check_saved(before, after, saved, request, may_grow_to=None):
    problems = invariant_problems(after, request)
    assert not problems, problems
    kept = texts(after)
    for text in texts(before) - kept:
        if not text.startswith(("[Earlier tool result", "<persisted-output", "[Compacted", "[Snipped")):
            assert text in saved, f"removed without being saved: {text[:80]!r}"
    assert s08.estimate_tokens(after) <= max(s08.estimate_tokens(before), may_grow_to or 0)


def request_of(messages):
    request = s08.current_request(messages)
    return request["text"] if request else None


layer_params = st.fixed_dictionaries({
    "keep_tail": st.integers(2, 47), "at_least": st.sampled_from([0, 5, 20]),
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

    def save_messages(self, removed, kind):
        self.texts |= {b.get("text") or s08.result_text(b) for m in removed for b in blocks(m)}
        return Path(f"transcripts/{kind}.jsonl")


def layer(name, p, store):
    """One cheap layer with drawn parameters (so it acts often), saving into the store."""
    save_output, save_messages = store.save_output, store.save_messages
    return {
        "tool_result_budget": lambda m: s08.tool_result_budget(m, max_chars=p["budget_chars"], preview_chars=400,
                                                               save_output=save_output),
        "snip_compact": lambda m: s08.snip_compact(m, keep_head=3, keep_tail=p["keep_tail"], at_least=p["at_least"],
                                                   min_tokens=p["min_tokens"] or 60, save_messages=save_messages),
        "micro_compact": lambda m: s08.micro_compact(m, keep_recent=p["keep_recent"], min_chars=120,
                                                     clear_at_least=p["clear_at_least"], save_output=save_output),
    }[name]


@pytest.mark.parametrize("name", ["tool_result_budget", "snip_compact", "micro_compact"])
@LAYER_CHECK
@given(histories(sizes=LAYER_SIZES, turns=4, rounds=5), layer_params)
@example(
    history=[{'role': 'user',
      'content': [{'type': 'text',
        'text': 'request 0: fix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\n'}]},
     {'role': 'assistant',
      'content': [{'type': 'text',
        'text': 'done fix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\n'}]},
     {'role': 'user',
      'content': [{'type': 'text',
        'text': 'request 1: fix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\n'}]},
     {'role': 'assistant',
      'content': [{'type': 'tool_use',
        'id': 'toolu_1',
        'name': 'bash',
        'input': {'command': 'step 1'}}]},
     {'role': 'user',
      'content': [{'type': 'tool_result',
        'tool_use_id': 'toolu_1',
        'content': 'fix\n'}]},
     {'role': 'assistant',
      'content': [{'type': 'tool_use',
        'id': 'toolu_2',
        'name': 'bash',
        'input': {'command': 'step 2'}},
       {'type': 'tool_use',
        'id': 'toolu_3',
        'name': 'bash',
        'input': {'command': 'step 3'}},
       {'type': 'tool_use',
        'id': 'toolu_4',
        'name': 'bash',
        'input': {'command': 'step 4'}},
       {'type': 'tool_use',
        'id': 'toolu_5',
        'name': 'bash',
        'input': {'command': 'step 5'}}]},
     {'role': 'user',
      'content': [{'type': 'tool_result',
        'tool_use_id': 'toolu_2',
        'content': '[Earlier tool result (bash) cleared to save context. Full output: x/toolu_2.txt.]'},
       {'type': 'tool_result',
        'tool_use_id': 'toolu_3',
        'content': 'fix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\nfix fix\n'},
       {'type': 'tool_result', 'tool_use_id': 'toolu_4', 'content': 'fix\n'},
       {'type': 'tool_result',
        'tool_use_id': 'toolu_5',
        'content': 'fix\n'}]}],
    params={'keep_tail': 2,
        'at_least': 0,
        'min_tokens': 0,
        'keep_recent': 0,
        'clear_at_least': 0,
        'budget_chars': 500},
)  # found by hypothesis: the preview was longer than the result it replaced
def test_each_cheap_layer_keeps_the_invariants(name, history, params):
    before = json.loads(json.dumps(history))
    store = MemoryStore()
    after = layer(name, params, store)(history)
    assert history == before, "a layer never edits its input"
    check_saved(history, after, store.texts, request_of(history))


@CHECK
@given(histories(), windows)
def test_the_whole_pipeline_keeps_the_invariants(history, window):
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        agent = s08.Agent(client=None, settings=replace(s08.Settings.for_window("m", window)), workdir=workdir,
                          system="system", tools=s08.TOOLS, out=lambda *a, **k: None,
                          summary_failures=s08.MAX_CONSECUTIVE_SUMMARY_FAILURES, breaker_announced=True,
                          endpoint=s08.Endpoint(window, can_count_tokens=False))  # no network: no summary call
        after = s08.compact_pipeline(agent, list(history))
        check(history, after, workdir, request_of(history))
        if s08.estimate_tokens(history) + agent.overhead > agent.settings.threshold:
            assert s08.estimate_tokens(after) + agent.overhead <= agent.settings.threshold


@CHECK
@given(histories(), windows, st.integers(1, 8))
@example(
    history=[{'role': 'user',
      'content': [{'type': 'text',
        'text': 'request 0: fix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\nfix\n'}]},
     {'role': 'assistant',
      'content': [{'type': 'tool_use',
        'id': 'toolu_1',
        'name': 'bash',
        'input': {'command': 'step 1'}}]},
     {'role': 'user',
      'content': [{'type': 'tool_result',
        'tool_use_id': 'toolu_1',
        'content': '上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n上下文\n'}]}],
    window=20000,
    undercount=3,
)  # found by hypothesis: the preview was longer than the result it replaced
def test_reactive_compact_fits_its_tail(history, window, undercount):
    config = s08.Settings.for_window("m", window)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        after = s08.reactive_compact(
            history, summarize=lambda m: "summary", restored=[],
            save_messages=lambda removed, kind: s08.save_transcript(folder, removed, kind),
            save_output=lambda i, t: s08.save_tool_output(folder, i, t), preview_chars=config.preview_chars,
            tail_tokens=config.threshold // (4 * undercount))
        # it only runs after the API refused a request; then its output is the tail plus a header
        header = s08.estimate_text_tokens(after[0]["content"][0]["text"]) + 50
        check(history, after, folder, request_of(history), may_grow_to=config.threshold // (4 * undercount) + header)
