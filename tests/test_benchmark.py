"""The benchmark script runs and reports every figure (its targets are checked by running it)."""

import json
import re

import pytest
import benchmark
from conftest import CODE
from s08_context_compact.compaction.store import save_transcript

REFERENCE = CODE.parent / "REFERENCE.md"  # the chapter's reference page holds the measured figures


def test_the_scripted_session_is_long_enough():
    session = benchmark.scripted_session(seed=7)
    assert session.model_calls >= 200
    texts = json.dumps([r for _, replies in session.turns for r in replies], ensure_ascii=False)
    assert "笔记" in texts and texts.count('"tool_use"') > session.model_calls / 2


def test_a_transcript_can_be_replayed(tmp_path, capsys, s08):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "read a.py"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file",
                                           "input": {"path": "a.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x = 1\n" * 500}]},
        {"role": "assistant", "content": [{"type": "text", "text": "It sets x."}]},
    ]
    path = save_transcript(tmp_path, history, "compact")
    session = benchmark.replayed_session(path, s08)
    assert session.turns[0][0] == "read a.py" and len(session.turns[0][1]) == 2
    assert benchmark.main(["--replay", str(path), "--window", "30000", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "1 user turns, 2 scripted model calls" in out and "Targets" not in out
    # the timings the full run prints, on small histories (the figures themselves depend on the machine)
    median, worst = benchmark.pipeline_time_at(s08, tmp_path, 100, turns=5)
    assert 0 < median <= worst and benchmark.resume_pass_time(s08, tmp_path, size=50, repeats=1) > 0


def printed_table(out: str) -> dict:
    """{row label: [figure per configuration]} from the benchmark's printed table."""
    columns = next(line.split("  ") for line in out.splitlines() if "full pipeline" in line or "cheap layers" in line
                   or "with idle gaps" in line)
    count = len([c for c in columns if c.strip()])
    rows = {}
    for line in out.splitlines():
        found = re.match(r"(\S.{0,24}?)((?:\s+[\d.,]+%?){" + str(count) + "})$", line.strip())
        if found:
            rows[found.group(1).strip()] = [float(v.replace(",", "").rstrip("%")) for v in found.group(2).split()]
    return rows


def chapter_figure(text: str) -> float:
    number = float(re.sub(r"[^\d.]", "", text))
    return number * (1e6 if text.strip().endswith("M") else 1e3 if text.strip().endswith("k") else 1)


PLAYED = {"full pipeline": ("full pipeline", "caching off"), "with idle gaps": ("with idle gaps",),
          "cheap layers off": ("cheap layers off",)}


@pytest.mark.parametrize("config", PLAYED)  # each played on its own: three workers share the work
def test_the_chapters_measured_figures_match_a_fresh_run(capsys, config):
    assert benchmark.main(["--no-timing", "--config", config]) == 0
    rows = printed_table(capsys.readouterr().out)
    chapter = REFERENCE.read_text(encoding="utf-8").split("\n## Measured\n")[1].split("\n## ")[0]
    heading = next(line for line in chapter.splitlines() if line.startswith("| | full pipeline"))
    columns = [c.strip() for c in heading.strip("|").split("|")][1:]
    labels = {"billed input tokens": "billed input tokens", "billed ÷ raw input": "billed / raw",
              "cache-read share": "cache-read share", "peak context (of 200k)": "peak context",
              "summaries": "summary calls", "prompt-too-long errors": "prompt-too-long errors"}
    checked = 0
    for line in chapter.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in labels:
            said_here = [cells[1 + columns.index(name)] for name in PLAYED[config]]
            for said, printed in zip(said_here, rows[labels[cells[0]]]):
                said = chapter_figure(said)
                assert abs(said - printed) <= max(0.02 * abs(printed), 1.0), (config, cells[0], said, printed)
                checked += 1
    assert checked == 6 * len(PLAYED[config])


def test_the_small_run_adds_up(capsys):
    assert benchmark.main(["--turns", "3", "--window", "30000", "--no-timing"]) == 0
    rows = printed_table(capsys.readouterr().out)
    full, gaps, no_cache, no_cheap = zip(*[rows[k] for k in ("billed / raw", "cache-read share", "tool_result_budget")])
    assert no_cache[0] == 100.0 and no_cache[1] == 0.0, "with caching off everything is billed at full price"
    assert rows["raw input tokens"][2] == rows["raw input tokens"][0], "...and the requests are the same"
    assert no_cheap[2] == 0 and full[2] > 0, "the budget layer acts only when the cheap layers are on"
    assert full[0] < no_cache[0] and full[1] > 50
    assert gaps[1] <= full[1], "idle gaps past the cache's life can only lower the share read"
    assert rows["prompt-too-long errors"] == [0, 0, 0, 0]
    assert rows["transcripts ÷ content"][0] <= 3.0, "the session log grows with content, not with rewrites"


def test_the_loops_waits_are_read_from_what_the_program_measured(tmp_path):
    """--ahead reads the waits from the session log (each call's time) and the summary ahead's
    own figures, in order with the compactions: no function of the program is swapped."""
    records = [{"type": "call", "what": "writing the summary", "seconds": 0.3},
               {"type": "layer", "layer": "compact_history", "seconds": 0.31},
               {"type": "call", "what": "waiting for the model", "context_tokens": 5_000, "seconds": 1.0},
               {"type": "layer", "layer": "micro_compact", "seconds": 0.001},
               {"type": "call", "what": "writing the summary ahead (set aside: /clear)", "seconds": 2.0},
               {"type": "call", "what": "writing the summary ahead", "seconds": 4.0},
               {"type": "layer", "layer": "reactive_compact", "seconds": 0.06},
               {"type": "call", "what": "waiting for the model", "context_tokens": 6_000, "seconds": 1.0}]
    log = tmp_path / "session.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert benchmark.summary_waits(log, [0.05]) == ([0.3, 0.05], [5_000, 6_000])
