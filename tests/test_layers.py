"""The compaction layers called directly with literal histories: no fakes needed."""

import copy
import json
from pathlib import Path

import pytest

from conftest import assert_valid, blocks, user, replace_with_summary
from s08_context_compact.compaction.store import save_tool_output, save_transcript
from s08_context_compact.basics import own_folder
from s08_context_compact.compaction import Settings
from s08_context_compact.messages import current_request, estimate_text_tokens, estimate_tokens, OWN


def call(*ids, name="read_file"):
    return {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": name, "input": {"path": f"{i}.txt"}}
                                             for i in ids]}


def results(*pairs):
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": text} for i, text in pairs]}


def answer(text="ok"):
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def pairs(count, size=500, start=0):
    history = []
    for n in range(start, start + count):
        history += [call(f"t{n}"), results((f"t{n}", f"{n}:" + "x" * size))]
    return history


@pytest.fixture
def savers(s08, tmp_path):
    class Savers:
        outputs = tmp_path / "tool-results"
        transcripts = tmp_path / "transcripts"

        def save_output(self, tool_use_id, text):
            return save_tool_output(own_folder(tmp_path, "tool-results"), tool_use_id, text)

        def save_messages(self, messages, kind, footer=None):
            return save_transcript(own_folder(tmp_path, "transcripts"), messages, kind, footer)
    return Savers()


def read_transcript(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def result_contents(messages):
    return {b["tool_use_id"]: b["content"] for m in messages for b in blocks(m) if b.get("type") == "tool_result"}


# ---------------------------------------------------------------- tool_result_budget

def test_budget_persists_largest_results_first_and_keeps_a_preview(s08, savers):
    big, medium, small = "B" * 150_000, "M" * 100_000, "s" * 10_000
    history = [user("read them"), call("a", "b", "c"), results(("a", medium), ("b", big), ("c", small))]
    before = copy.deepcopy(history)
    out = s08.tool_result_budget(history, max_chars=200_000, preview_chars=2_000, store=savers)
    assert history == before, "the layer must not edit its input"
    contents = result_contents(out)
    assert contents["a"] == medium and contents["c"] == small
    assert contents["b"].startswith("<persisted-output") and "B" * 2000 in contents["b"]
    saved = list(savers.outputs.iterdir())
    assert [p.read_bytes() for p in saved] == [big.encode()]
    assert str(saved[0]) in contents["b"]
    assert sum(len(c) for c in contents.values()) <= 200_000
    assert_valid(out, "read them")


def test_budget_leaves_results_under_the_limit_alone(s08, savers):
    history = [user("go"), call("a"), results(("a", "x" * 1000))]
    assert s08.tool_result_budget(history, max_chars=5000, preview_chars=100, store=savers) is history
    assert not savers.outputs.exists()


def test_budget_keeps_non_ascii_output_byte_identical_on_disk(s08, savers):
    text = "上下文压缩 " * 5000 + "\udcff"  # a lone surrogate, as a decoded binary file may carry
    history = [user("go"), call("a"), results(("a", text))]
    out = s08.tool_result_budget(history, max_chars=1000, preview_chars=100, store=savers)
    path = next(savers.outputs.iterdir())
    assert path.read_bytes() == text.encode("utf-8", "surrogatepass")
    assert result_contents(out)["a"].count("上下文") > 0


# ---------------------------------------------------------------- snip_compact

def test_snip_keeps_tool_pairs_and_saves_what_it_removes(s08, savers):
    history = [user("build it")] + pairs(40) + [answer("done"), user("now test it")] + pairs(5, start=40)
    out = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=0, tools=s08.TOOLS, store=savers)
    assert_valid(out, "now test it")
    assert len(out) <= 51
    assert out[0] == history[0]
    removed = read_transcript(next(savers.transcripts.iterdir()))
    kept_ids = set(result_contents(out))
    assert kept_ids.isdisjoint(result_contents(removed))
    assert kept_ids | set(result_contents(removed)) == set(result_contents(history))
    marker = [b["text"] for m in out for b in blocks(m) if b.get("type") == "text" and b["text"].startswith("[Snipped")]
    assert len(marker) == 1 and f"{len(removed)} messages" in marker[0]


def test_snip_keeps_the_current_request_when_it_falls_in_the_middle(s08, savers):
    history = [user("first"), answer(), user("the real task: rename foo to bar everywhere")] + pairs(60)
    out = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=0, tools=s08.TOOLS, store=savers)
    assert len(out) < len(history)
    assert_valid(out, "the real task: rename foo to bar everywhere")


def test_snip_folds_repeated_snips_into_one_marker(s08, savers):
    history = [user("go")] + pairs(30)
    once = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=0, tools=s08.TOOLS, store=savers)
    twice = s08.snip_compact(once + pairs(10, start=30), keep_head=3, keep_tail=47,
                             at_least=0, tools=s08.TOOLS, store=savers)
    markers = [b["text"] for m in twice for b in blocks(m) if b.get("type") == "text" and b["text"].startswith("[Snipped")]
    assert len(markers) == 1
    removed = sum(len(read_transcript(p)) for p in savers.transcripts.iterdir())
    assert f"[Snipped {removed} messages" in markers[0]
    assert_valid(twice, "go")


@pytest.mark.parametrize("keep_head", [1, 2, 4])
def test_snip_moves_a_head_that_would_end_inside_a_pair(s08, savers, keep_head):
    # Index keep_head is a tool_result message here (or the call before it): the head must
    # end before the next call instead, or a result would lose its call.
    history = [user("go")] + pairs(60)
    out = s08.snip_compact(history, keep_head=keep_head, keep_tail=20, at_least=0, tools=s08.TOOLS, store=savers)
    assert len(out) < len(history)
    assert_valid(out, "go")
    head_end = keep_head + (1 - keep_head % 2)  # the first call at or after keep_head starts the cut
    assert out[:head_end - 1] == history[:head_end - 1], "the head is kept whole..."
    assert blocks(out[head_end - 1])[:-1] == blocks(history[head_end - 1]), "...its last message gets the marker"


def test_the_snip_marker_says_what_the_snipped_part_did(s08, savers):
    failing = [call("b1", name="bash"), results(("b1", "FAILED test_x\n[exit code 1]"))]
    failing[0]["content"][0]["input"] = {"command": "pytest -x"}
    history = [user("go")] + pairs(10) + failing + pairs(50, start=10)
    out = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=0, tools=s08.TOOLS, store=savers)
    marker = [b["text"] for m in out for b in blocks(m) if b.get(OWN) == "snip"][0]
    assert all(f"\n- read_file t{n}.txt (call t{n})" in marker for n in range(1, 36)), "each call, with its id"
    assert "\n- bash pytest -x (exit 1) (call b1)" in marker, "a command, and how it ended"
    assert "t36.txt" not in marker, "what is still in context is not listed"
    # Calls that cost little each: their lines would cost more than an eighth of what went,
    # so the older ones are named by what they did, the newest one by one.
    history = [user("go")] + pairs(1, size=0) + failing + pairs(59, size=0, start=1)
    out = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=0, tools=s08.TOOLS, store=savers)
    marker = [b["text"] for m in out for b in blocks(m) if b.get(OWN) == "snip"][0]
    assert "\nread: " in marker and "\nran: `pytest -x` (exit 1)" in marker, "the older ones, by what they did"
    assert "\n- read_file t35.txt (call t35)" in marker and "(call t1)" not in marker
    assert len(marker) < len(json.dumps(history[3:-47])) / 4


def test_snip_does_nothing_below_the_limit(s08, savers):
    history = [user("go")] + pairs(20)
    assert s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=0, tools=s08.TOOLS, store=savers) is history


# ---------------------------------------------------------------- micro_compact

def test_micro_compact_keeps_newest_results_and_saves_old_ones(s08, savers):
    history = [user("read")] + pairs(6) + [answer(), user("and now?")]
    before = copy.deepcopy(history)
    out = s08.micro_compact(history, keep_recent=3, min_chars=120, clear_at_least=0, store=savers)
    assert history == before
    contents = result_contents(out)
    for n in range(3):
        assert contents[f"t{n}"].startswith("[Earlier tool result (read_file)")
        saved = Path(contents[f"t{n}"].split("Full output: ")[1].split(". Read")[0])
        assert saved.read_text() == result_contents(history)[f"t{n}"]
    for n in range(3, 6):
        assert contents[f"t{n}"] == result_contents(history)[f"t{n}"]
    assert_valid(out, "and now?")


def test_micro_compact_skips_results_shorter_than_a_placeholder(s08, savers):
    history = [user("go")] + pairs(6, size=50)
    assert s08.micro_compact(history, keep_recent=3, min_chars=120, clear_at_least=0, store=savers) is history


def test_micro_compact_never_blanks_results_the_model_has_not_seen(s08, savers):
    parallel = [(f"p{n}", "y" * 800) for n in range(6)]
    history = [user("read all six"), call(*[i for i, _ in parallel]), results(*parallel)]
    out = s08.micro_compact(history, keep_recent=3, min_chars=120, clear_at_least=0, store=savers)
    assert out is history


def test_micro_compact_points_at_an_already_persisted_copy(s08, savers):
    history = [user("go"), call("a"), results(("a", "z" * 50_000))] + pairs(4, start=1)
    budgeted = [history[0], history[1], s08.tool_result_budget(
        history[:3], max_chars=1000, preview_chars=200, store=savers)[-1]] + history[3:]
    out = s08.micro_compact(budgeted, keep_recent=3, min_chars=120, clear_at_least=0, store=savers)
    assert len(list(savers.outputs.iterdir())) == 2  # the big one once, plus t1
    placeholder = result_contents(out)["a"]
    assert str(savers.outputs / "a.txt") in placeholder


def test_micro_compact_is_stable_when_run_again(s08, savers):
    history = [user("go")] + pairs(8)
    once = s08.micro_compact(history, keep_recent=3, min_chars=120, clear_at_least=0, store=savers)
    twice = s08.micro_compact(once, keep_recent=3, min_chars=120, clear_at_least=0, store=savers)
    assert twice is once
    assert json.dumps(once) == json.dumps(s08.micro_compact(history, keep_recent=3, min_chars=120,
                                                            clear_at_least=0, store=savers))


# ---------------------------------------------------------------- compact_history

def test_compact_history_mid_turn_keeps_the_calls_in_flight_and_the_request(s08, savers):
    history = [user("old task"), answer(), user("fix the parser")] + pairs(4)
    out = replace_with_summary(s08, history, "compact", "SUMMARY TEXT", s08.compact_tail(history), [], store=savers,
                                   preview_chars=2000)
    assert_valid(out, "fix the parser")
    assert out[0]["content"][0]["text"].startswith("[Compacted") and "SUMMARY TEXT" in out[0]["content"][0]["text"]
    assert out[1:] == history[-2:]
    assert read_transcript(next(savers.transcripts.iterdir())) == history


def test_compact_history_at_turn_start_ends_with_the_request(s08, savers):
    history = [user("a")] + pairs(3) + [answer(), user("next: add tests")]
    out = replace_with_summary(s08, history, "compact", "S", s08.compact_tail(history), [], store=savers,
                                   preview_chars=2000)
    assert len(out) == 1
    assert out[0]["content"][-1] == {"type": "text", "text": "next: add tests"}


def test_compact_history_persists_big_unseen_results_before_shortening_them(s08, savers):
    history = [user("go"), call("a"), results(("a", "q" * 30_000))]
    out = replace_with_summary(s08, history, "compact", "S", s08.compact_tail(history), [], store=savers,
                                   preview_chars=500)
    assert result_contents(out)["a"].startswith("<persisted-output")
    assert (savers.outputs / "a.txt").read_text() == "q" * 30_000
    assert_valid(out, "go")


def test_compact_history_never_returns_a_larger_history(s08, savers):
    history = [user("go"), answer("done")]
    restored = ["[Restored after compaction: a.py, re-read]\n" + "x = 1\n" * 200]
    out = replace_with_summary(s08, history, "compact", "The user said go.", s08.compact_tail(history), restored,
                                   store=savers, preview_chars=500)
    assert out is history, "a summary plus restored files would be larger than the two messages"
    assert read_transcript(next(savers.transcripts.iterdir())) == history, "the transcript is saved all the same"


# ---------------------------------------------------------------- reactive_compact

def test_reactive_compact_keeps_only_recent_groups_that_fit(s08, savers):
    history = [user("refactor")] + pairs(30, size=4000)
    out = replace_with_summary(s08, history, "reactive", "S", s08.reactive_tail(history, 3000), [], store=savers,
                                   preview_chars=500)
    assert_valid(out, "refactor")
    assert estimate_tokens(out) < estimate_tokens(history) // 10
    assert out[0]["content"][0]["text"].startswith("[Reactive compact")
    assert read_transcript(next(savers.transcripts.iterdir())) == history


def test_restored_context_sits_between_the_summary_and_the_request(s08, savers):
    history = [user("old"), answer(), user("now fix parser.py")] + pairs(2)
    restored = ["[Restored after compaction: todo list]\n[>] fix it", "[Restored after compaction: a.py, re-read]\nx"]
    out = replace_with_summary(s08, history, "compact", "S", s08.compact_tail(history), restored, store=savers,
                                   preview_chars=2000)
    texts = [b["text"] for b in out[0]["content"]]
    assert texts[0].startswith("[Compacted") and texts[1:3] == restored and texts[3] == "now fix parser.py"
    assert_valid(out, "now fix parser.py")
    assert current_request(out)["text"] == "now fix parser.py", "restored blocks are never taken for requests"


# ---------------------------------------------------------------- saving

def test_saved_outputs_never_overwrite_each_other(s08, tmp_path):
    first = save_tool_output(tmp_path, "toolu_1", "one")
    again = save_tool_output(tmp_path, "toolu_1", "one")
    other = save_tool_output(tmp_path, "toolu_1", "two")
    assert first == again and other != first
    assert first.read_text() == "one" and other.read_text() == "two"
    weird = save_tool_output(tmp_path, "../../etc/passwd", "x")
    assert weird.parent == tmp_path


def test_transcript_round_trips_as_json(s08, tmp_path):
    history = [user("中文 request"), call("a"), results(("a", "line\nwith \"quotes\""))]
    path = save_transcript(tmp_path, history, "compact")
    assert read_transcript(path) == history
    assert save_transcript(tmp_path, history, "compact") != path


def test_estimate_counts_cjk_as_one_token_per_character(s08):
    assert estimate_text_tokens("a" * 400) == 101
    assert estimate_text_tokens("压" * 400) == 401


def test_thresholds_are_derived_from_the_window(s08):
    big = Settings.for_window("m", 200_000)
    assert big.threshold == 200_000 - 8_192 - 13_000
    assert big.budget_chars == int(big.threshold * 0.15 * 4) and big.preview_chars == 2_000
    assert Settings.for_window("m", 1_000_000).budget_chars == 200_000, "the chapter's figure is the ceiling"
    small = Settings.for_window("m", 20_000)
    assert small.threshold == 20_000 - 5_000 - 2_000
    assert small.budget_chars < 20_000 and small.summary_max_tokens <= small.max_output


# ---------------------------------------------------------------- cache-aware clearing

def test_micro_compact_clears_nothing_below_the_minimum(s08, savers):
    history = [user("go")] + pairs(5, size=400) + [answer(), user("next")]
    freed = sum(estimate_text_tokens(f"{n}:" + "x" * 400) - s08.PLACEHOLDER_TOKENS for n in range(2))
    assert s08.micro_compact(history, keep_recent=3, min_chars=120, clear_at_least=freed + 1,
                             store=savers) is history
    assert not savers.outputs.exists(), "nothing is saved when nothing is cleared"
    out = s08.micro_compact(history, keep_recent=3, min_chars=120, clear_at_least=freed,
                            store=savers)
    cleared = [i for i, c in result_contents(out).items() if c.startswith("[Earlier tool result")]
    assert cleared == ["t0", "t1"]
    assert estimate_tokens(history) - estimate_tokens(out) >= freed


def test_snip_cuts_at_least_the_minimum_so_it_does_not_fire_every_turn(s08, savers):
    history = [user("go")] + pairs(26)  # 53 messages: just over head 3 + tail 47
    out = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=20, tools=s08.TOOLS, store=savers)
    assert len(history) - len(out) >= 20
    assert_valid(out, "go")
    again = out + pairs(5, start=26)
    assert s08.snip_compact(again, keep_head=3, keep_tail=47, at_least=20,
                            tools=s08.TOOLS, store=savers) is again


def test_snip_skips_a_cut_too_small_to_pay_for_the_cache_rewrite(s08, savers):
    history = [user("go")] + pairs(30, size=20)
    middle = estimate_tokens(history[3:23])
    assert s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=20, min_tokens=middle * 2,
                            tools=s08.TOOLS, store=savers) is history
    assert not savers.transcripts.exists()
    out = s08.snip_compact(history, keep_head=3, keep_tail=47, at_least=20, min_tokens=middle // 2,
                           tools=s08.TOOLS, store=savers)
    assert len(out) < len(history)
