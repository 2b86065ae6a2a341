"""--demo: the scripted walk through every layer, as a user runs it (no key, no network)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CODE, RUN
from s08_context_compact.command_line.session_picture import COLOURS

CHAPTER_PICTURE = CODE.parent / "images" / "demo-session.svg"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One run of the demo, as a user runs it: no key, no endpoint, no model; its workspace
    (mkdtemp) in a folder of the tests', not /tmp."""
    folder = tmp_path_factory.mktemp("demo")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder)}
    done = subprocess.run([sys.executable, str(RUN), "--demo", "--no-pause"], capture_output=True, text=True,
                          cwd=folder, env=env, timeout=60)
    return done, folder


def test_demo_runs_offline_and_every_layer_fires(demo):
    done, tmp_path = demo
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "SCRIPTED model" in out
    for line in ("[tool_result_budget] ", "[snip_compact] ", "[micro_compact] ", "[compact_history] ",
                 "[reactive_compact] ", "● compact  ", "summaries failed in a row", "summary by fallback"):
        assert line in out, f"missing {line!r}"
    steps = re.findall(r"^== (\d)/7 ", out, re.M)
    assert steps == [str(n) for n in range(1, 8)]
    workspace = Path(re.search(r"Workspace: (\S+)", out).group(1))
    assert workspace.parent == tmp_path, "the run leaves nothing behind in /tmp"
    named = re.findall(r"^   wrote (\S+)$", out, re.M) + re.findall(r"saved to (\.transcripts/\S+?\.jsonl)", out)
    assert named and all((workspace / path).is_file() for path in named)
    assert re.search(r"The session log is (\S+\.jsonl)", out) and "\033[" not in out
    # each step says what its layers did, not a before and after that mixes in the new content
    assert "   this step: tool_result_budget 1× −11.1k; the context is now" in out
    assert "   this step: no layer acted;" in out and "context before" not in out
    step4 = out.split("== 4/7 ")[1].split("== 5/7 ")[0]
    assert len(step4.splitlines()) < 20 and "[compact_history] " in step4, "the filler does not bury the layer line"
    # the summary of step 4 was written in the background while the explanation went on, and swapped in
    assert step4.index("[summary ahead] writing a summary") < step4.index("[summary ahead] swapped in") \
        < step4.index("[compact_history] ")
    assert "window. step [...]\n" in step4 and "ledger check: the summary mentions" in step4
    step3 = out.split("== 3/7 ")[1].split("== 4/7 ")[0]
    written = re.findall(r"^   wrote (\S+)$", step3, re.M)
    assert written[0].startswith(".transcripts/snip-"), "files are listed in the order they were written: snip first"
    assert "because 3 summary calls failed in a row" in out, "a fallback made because the breaker is open says so"
    # the demo explains itself: sizes against what they are compared with, the refusal beside
    # our estimate, runs of alike tool calls and retries as one counted line, hooks said once
    assert "of the 7,800-token threshold (snip and micro act past 5,460, a summary past 7,800)" in out
    assert "% of the window" not in out
    step5 = out.split("== 5/7 ")[1].split("== 6/7 ")[0]
    refusal = re.search(r"refused a request we had estimated at ([\d,]+) tokens, saying \"prompt is too long: "
                        r"12800 tokens > 12000 maximum\"", step5)
    assert refusal and int(refusal.group(1).replace(",", "")) < 12_000 and "tokenizer" in step5
    assert re.search(r"^\[×20\] ● bash  bash step\.sh 10 → step 10 ok  \.\.\. the last: ● bash  bash step\.sh 29 → "
                     r"step 29 ok$", out, re.M)
    assert len(re.findall(r"^\[×3\] \[api\] 500 ", out, re.M)) == 3 and "(retry 2 of 3)" not in out
    assert "step.sh 15" not in out, "the middle of a run is not printed"
    assert out.count("Hooks are functions the agent calls") == 1 and "the fact ledger (ledger.py)" in out


def test_the_demo_ends_with_its_picture_the_one_the_chapter_shows(demo):
    done, _ = demo
    assert done.returncode == 0, done.stderr
    page = Path(re.search(r"\[report\] a picture of the session: (\S+\.html)", done.stdout).group(1))
    assert page.is_file() and f"\n  {page.as_uri()}\n" in done.stdout, "the address whole, on a line of its own"
    chart = page.with_suffix(".svg").read_text(encoding="utf-8")
    assert chart == CHAPTER_PICTURE.read_text(encoding="utf-8"), \
        f"the demo's picture changed: copy {page.with_suffix('.svg')} to {CHAPTER_PICTURE} and look at it"
    # one point per model call with its logged size, one mark per layer run with what it freed
    records = [json.loads(line) for line in (page.parent / page.name.replace("report-", "session-")
                                             .replace(".html", ".jsonl")).read_text().splitlines()]
    steps = [r for r in records if r["type"] == "call" and r["what"] == "waiting for the model"]
    assert len(re.findall(r"<circle ", chart)) == len(steps) > 40
    assert all(f": {r['context_tokens']:,} tokens (counted by the endpoint)</title>" in chart for r in steps)
    layers = [r for r in records if r["type"] == "layer"]
    assert {r["layer"] for r in layers} == set(COLOURS)
    for r in layers:
        assert re.search(rf"<title>{r['layer']}( ×\d+)?: freed [\d,]+ tokens", chart), r
    assert sum(int(m or 1) for m in re.findall(r'class="layer"><title>\w+(?: ×(\d+))?:', chart)) == len(layers)
    html = page.read_text(encoding="utf-8")
    transcripts = {p for r in layers for p in r["saved_to"] if p.endswith(".jsonl")}
    assert transcripts and all(f'<a href="{Path(p).name}">' in html for p in transcripts if Path(p).exists())
    assert "summary by fallback" in html and "summary by the model" in html and "<details>" in html
    # what each snip cut: summarized ahead in the background, so in view from the very call
    # the snip made room for, its summary joined with its note
    snip_at = [k for k, r in enumerate(records) if r["type"] == "layer" and r["layer"] == "snip_compact"]
    calls_before = sum(1 for r in records[:snip_at[0]] if r in steps)
    assert f"summarized in the background, in view from call {calls_before + 1}" in html
    assert "<script" not in html and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
