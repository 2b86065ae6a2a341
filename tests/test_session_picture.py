"""--report and /report: a picture of a session, from its log, that no text in it can turn
into markup, and that stays small for a long session."""

import os
import re
from xml.etree import ElementTree

from s08_context_compact.command_line import session_picture
from benchmark import long_log
from conftest import run_cli
from s08_context_compact.offline.fake_anthropic import text, tool_use
from s08_context_compact.command_line import handle_command
from s08_context_compact.command_line import open_session

HOSTILE = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>']


def test_text_from_a_file_a_prompt_and_a_summary_is_shown_as_text(s08, make_agent, fake, workspace):
    (workspace / "evil.md").write_text(f"# notes {HOSTILE[0]} {HOSTILE[1]}\n" * 40)
    agent = make_agent()
    messages = open_session(agent, None)
    fake.reply(tool_use("read_file", {"path": "evil.md"}), text(f"It says {HOSTILE[1]}"))
    assert s08.take_turn(agent, messages, f"read evil.md {HOSTILE[0]} {HOSTILE[1]}")
    fake.summary(text(f"<summary>The user asked about evil.md. {HOSTILE[0]} {HOSTILE[1]}</summary>"))
    handle_command(agent, messages, "/compact", s08.LESSON)
    handle_command(agent, messages, "/report", s08.LESSON)
    page = session_picture.write_report(agent.log.path)
    shown = page.read_text(encoding="utf-8") + page.with_suffix(".svg").read_text(encoding="utf-8")
    assert "<script" not in shown and "<img" not in shown and "onerror=alert(1)>" not in shown
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in shown, "the prompt and the summary, as text"
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in shown
    assert f"[report] a picture of the session: {page}" in agent.out.text
    assert re.search(r"summary by the model.*The user asked about evil\.md\. &lt;script&gt;", shown, re.S)


def test_ten_thousand_calls_make_a_page_under_two_megabytes(tmp_path):
    log = tmp_path / ".transcripts" / "session-long.jsonl"
    log.parent.mkdir()
    long_log(log, 10_000)
    page = session_picture.write_report(log)
    shown = page.read_text(encoding="utf-8")
    assert len(page.read_bytes()) < 2_000_000
    points = len(re.findall(r"<circle ", shown))
    assert 1_000 <= points <= session_picture.MAX_POINTS, "a screenful of points, each the peak of its group"
    assert "each point the peak of 7" in shown and "calls 1–7: " in shown
    assert "… and 100 more runs, not listed." in shown
    assert "(not on disk)" in shown and '<a href="compact-99.jsonl">' in shown
    assert re.search(r"prompt \(and 27 more\): step 0: go on with the &quot;migration&quot; &lt;of&gt; the \^\[\[31m",
                     shown), "a tick for every 28 prompts, their first as text"
    assert len(re.findall('class="prompt"', shown)) <= session_picture.MAX_TICKS
    ElementTree.fromstring(page.with_suffix(".svg").read_text(encoding="utf-8"))  # well-formed XML: no raw ESC


def test_the_report_command_names_the_page_or_says_why_there_is_none(fake, workspace):
    done = run_cli(fake, workspace, "", args=["--report"])
    assert done.returncode == 2 and "[report] No sessions in" in done.stderr and "start one first" in done.stderr
    fake.reply(text("Hello."))
    assert run_cli(fake, workspace, "hi\n/report\n").returncode == 0
    [page] = (workspace / ".transcripts").glob("report-*.html")
    done = run_cli(fake, workspace, "", args=["--report"])
    assert done.returncode == 0 and done.stdout.startswith(f"[report] a picture of the session: {page}")
    assert done.stdout.endswith(f"To open in a browser:\n  {page.as_uri()}\n")
    assert "hi" in page.read_text() and page.with_suffix(".svg").is_file()


def test_a_pipe_in_a_transcripts_place_does_not_make_the_report_wait(tmp_path):
    log = tmp_path / ".transcripts" / "session-long.jsonl"
    log.parent.mkdir()
    long_log(log, 120)
    (log.parent / "compact-99.jsonl").unlink()
    os.mkfifo(log.parent / "compact-99.jsonl")
    shown = session_picture.write_report(log).read_text(encoding="utf-8")
    assert "transcript not readable" in shown
