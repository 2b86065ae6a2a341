"""--demo: the scripted walk through every layer, as a user runs it (no key, no network)."""

import re
import subprocess
import sys
from pathlib import Path

from conftest import CODE


def test_demo_runs_offline_and_every_layer_fires(tmp_path):
    # no key, no endpoint, no model; the demo's workspace (mkdtemp) goes in this test's tmp_path, not /tmp
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(CODE), "--demo", "--no-pause"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
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
