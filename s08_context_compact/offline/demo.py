"""The scripted demo behind `python s08_context_compact/code.py --demo`.

A scripted model drives code.py's real agent loop and real compaction pipeline. It is not
Claude: its replies are written below, in advance. It talks through the real anthropic
SDK to the fake Messages API in the package fake_anthropic (beside this file), on
127.0.0.1, with a 12,000-token window. No API key and no network are needed. The steps make
each layer fire in turn, in a temporary workspace of generated files that is kept afterwards, so
you can read what every layer saved.

This file is not part of the lesson: read code.py for that.
"""

import json
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import anthropic

from .fake_anthropic import FakeAnthropic, error, server_error, text, tool_use
from ..command_line import (Agent, build_system_prompt, handle_command, install_hooks, open_session,
                            report_line, TOOL_MARK)
from ..compaction import Settings
from ..basics import (definitions, discover_skills, OWN_FOLDERS, TASK_OUTPUTS_DIR, TRANSCRIPT_DIR,
                      STYLES, cut_to_width, format_tokens, printable, terminal_columns)

WINDOW = 12_000
SCRIPTED = "(scripted) "
REFUSAL = "prompt is too long: 12800 tokens > 12000 maximum"


def make_workspace() -> Path:
    workspace = Path(tempfile.mkdtemp(prefix="s08-demo-"))
    (workspace / "build.log").write_text(
        "".join(f"[{n:05d}] compiling module_{n % 97}.c ... ok\n" for n in range(1_200)))
    # the first ten steps print a screenful, the rest one line:
    # the oldest messages are the big ones
    (workspace / "step.sh").write_text(
        'n=$1\nif [ "$n" -lt 10 ]; then\n  for k in $(seq 1 20); do '
        'echo "step $n: checked file_${n}_$k.c, 0 warnings, 0 errors"; done\n'
        'else\n  echo "step $n ok"\nfi\n')
    notes = workspace / "notes"
    notes.mkdir()
    for n in range(6):
        (notes / f"chapter{n}.md").write_text(f"# Chapter {n}\n" + "".join(
            f"Line {k} of chapter {n}: context windows fill up, so old results must make room.\n"
            for k in range(45)))
    return workspace


def explanation(n: int, steps: int = 90) -> str:
    return SCRIPTED + f"Part {n}, in detail: " + " ".join(
        f"step {k} keeps the newest work and moves the oldest out of the window."
        for k in range(steps))


STEPS = [
    ("tool_result_budget",
     "one tool result larger than a message may hold goes to disk; a preview stays",
     "Show me build.log",
     {"replies": [tool_use("bash", {"command": "cat build.log"}),
                  text(SCRIPTED + "build.log is a long, clean build log.")]}),
    ("a long history",
     "past 50 messages but far from full: nothing is snipped, the cache stays warm",
     "Run the 30 build steps, one command each",
     {"replies": [tool_use("bash", {"command": f"bash step.sh {n}"}) for n in range(30)]
      + [text(SCRIPTED + "All 30 steps ran.")]}),
    ("snip_compact, micro_compact",
     "past 70% of the threshold (micro_trigger): the middle goes to a "
     "transcript, then old results become pointers to their saved copies",
     "Read the six chapter notes, one at a time",
     {"replies": [tool_use("read_file", {"path": f"notes/chapter{n}.md"}) for n in range(6)]
      + [text(SCRIPTED + "All six chapters read.")]}),
    ("compact_history",
     "still over the threshold after the cheap layers: a summary replaces the history. "
     "Hooks are functions the agent calls at fixed moments "
     "(before a tool runs, around a compaction); "
     "the fact ledger (ledger.py) is one: it records each file read and command run, "
     "and the ledger check under the summary counts how many of those facts "
     "the summary still names",
     "Explain the pipeline in four long parts",
     {"turns": 4, "replies": [text(explanation(n)) for n in range(4)],
      "summaries": [text("<analysis>scripted</analysis><summary>1. Primary request: "
                         "read build.log and the notes (notes/chapter0.md to notes/chapter3.md), "
                         "run 30 build steps, explain the pipeline. "
                         "8. Current work: part 3 of the explanation.</summary>")]}),
    ("reactive_compact", "the API answers \"prompt is too long\": compact hard, send again",
     "One more question about the notes",
     {"refusal": True,
      "replies": [error(400, "invalid_request_error", REFUSAL),
                  text(SCRIPTED + "Recovered after the emergency compaction.")],
      "summaries": [text("<summary>The user asked about the notes "
                         "after a long explanation.</summary>")]}),
    ("compact", "the model itself asks for compaction; it runs after the current tool calls",
     "That phase is finished: tidy up the context",
     {"replies": [tool_use("compact", {"focus": "the build steps and the chapter notes"}),
                  text(SCRIPTED + "Context tidied; carrying on from the summary.")],
      "summaries": [text("<summary>1. Primary request: finish the phase. "
                         "7. Pending tasks: none.</summary>")]}),
    ("circuit breaker",
     "summaries that fail 3 times in a row stop being asked for; compaction goes on",
     "/compact",
     {"commands": 4, "between": "Explain it once more",
      "replies": [text(explanation(n, 70)) for n in range(4)],
      "summaries": [server_error() for _ in range(12)]}),
]


class FoldedReplies:
    """Prints what the agent says, shortened for a demo: only the start of each streamed
    reply (the scripted explanations are long on purpose, to fill the window), and a run of
    tool calls or retries alike but for their numbers (30 calls of one script, three
    retries) as one counted line. A tool call and its result count as one."""

    def __init__(self, shown_chars: int = 240):
        self.shown_chars, self.streamed, self.folded = shown_chars, 0, False
        # set once the agent exists: the width and colours are its
        self.agent = None
        # a tool call's line, until its result comes
        self.call = None
        # the first and last of a run of alike units
        self.run, self.last, self.count = None, None, 0

    def __call__(self, *args, end: str = "\n", flush: bool = False) -> None:
        text = " ".join(map(str, args))
        if end and not (self.streamed or self.folded):
            self.line(text)
        elif end:  # the end of a streamed reply
            print("" if self.folded else text, end=end, flush=True)
            self.streamed, self.folded = 0, False
        else:
            self.flush()
            self.streamed += len(text)
            if self.folded:
                return
            if self.streamed <= self.shown_chars or " " not in text:
                print(text, end="", flush=True)
            else:  # past the limit: finish the word, then fold
                print(text.split(" ", 1)[0] + " [...]", end="", flush=True)
                self.folded = True

    def line(self, text: str) -> None:
        if self.call and unstyled(text).startswith(("  < ", "  ✗ ")):
            self.take(self.call + [text])  # a call and its result: one unit
            self.call = None
            return
        if self.call:
            self.take(self.call)
        self.call = [text] if unstyled(text).startswith(TOOL_MARK + " ") else None
        if not self.call:
            self.take([text])

    def take(self, unit: list) -> None:
        # tool calls and retries; not what a layer did
        foldable = unstyled(unit[0]).startswith((TOOL_MARK + " ", "[api] "))
        if foldable and self.run and shape(unit) == shape(self.run):
            self.last, self.count = unit, self.count + 1
            return
        self.show_run()
        self.run, self.last, self.count = unit, unit, 1

    def flush(self) -> None:
        """Print all held back (before a streamed reply, a question, or the end)."""
        if self.call:
            self.take(self.call)
            self.call = None
        self.show_run()
        self.run, self.count = None, 0

    def show_run(self) -> None:
        """A run of one unit as it was, a longer one as a single counted line."""
        if not self.run:
            return
        if self.count == 1:
            for line in self.run:
                print(line, flush=True)
            return
        first, last = (" → ".join(unstyled(t).strip(" <✗") for t in unit)
                       for unit in (self.run, self.last))
        text = f"[×{self.count}] {first}  ... the last: {last}"
        columns = terminal_columns(self.agent.fit_width) if self.agent else None
        text = cut_to_width(text, columns - 1) if columns else text
        print(f"{STYLES['dim']}{text}\033[0m" if self.agent and self.agent.color else text,
              flush=True)


def unstyled(text: str) -> str:
    return re.sub(r"\033\[[0-9;]*m", "", text)


def shape(unit: list) -> list:
    """What lines look like with every number taken out: alike lines have the same shape."""
    return [re.sub(r"\d+(\.\d+)?", "#", unstyled(text)) for text in unit]


def files_under(workspace: Path) -> set:
    return {p for d in OWN_FOLDERS for p in (workspace / d).rglob("*") if p.is_file()}


def run(code, pause: bool) -> int:
    """Play every step; return the exit code."""
    workspace = make_workspace()
    terminal = sys.stdout.isatty()
    with FakeAnthropic(context_window=WINDOW) as fake:
        client = anthropic.Anthropic(api_key="scripted-demo", base_url=fake.url, max_retries=0)
        # the scripted server errors are answered at once:
        # waiting out a backoff would show nothing
        # the early mark held at 80% of the threshold,
        # so the summary written ahead comes at the same step each run, and the summary of
        # what snip cut joins at the step after the snip
        settings = replace(Settings.for_window("scripted-demo-model", WINDOW),
                           retry_base_seconds=0.05,
                           summary_ahead=(0.8, 0.8), snip_summary_waits=True)
        skills = discover_skills([Path(code.__file__).resolve().parent / "skills"])
        agent = Agent(client=client, settings=settings,
                           workdir=workspace, tools=code.TOOLS, skills=skills,
                           color=terminal, fit_width=terminal,
                           # named by its folder alone: the sizes (and the chapter's picture)
                           # are the same wherever the system keeps temporary folders
                           system=build_system_prompt(Path(workspace.name), skills),
                           confirm=lambda question: (False, "the demo answers no"),
                           out=FoldedReplies())
        agent.out.agent = agent
        install_hooks(agent, code.permission_hook)
        say = agent.say  # fitted to the terminal's width, as the agent's own lines are
        say("s08 scripted demo: a SCRIPTED model (canned replies, not Claude) "
            "drives the real agent loop and compaction pipeline of code.py, "
            "through the real SDK, against a local fake API with a "
            f"{WINDOW:,}-token window. No key, no network.\nWorkspace: {workspace}", "title")
        messages = open_session(agent, None)
        for number, (name, what, prompt, script) in enumerate(STEPS, start=1):
            play_step(code, agent, fake, messages, f"{number}/{len(STEPS)} {name}",
                      what, prompt, script, say)
            agent.out.flush()
            if pause and number < len(STEPS):
                input("Press Enter for the next step... ")
    outputs = list((workspace / TASK_OUTPUTS_DIR).rglob("*.txt"))
    transcripts = list((workspace / TRANSCRIPT_DIR).glob("*.jsonl"))
    say(f"\nDone. The demo wrote {len(transcripts)} transcripts "
        f"to {workspace / TRANSCRIPT_DIR} and "
        f"{len(outputs)} saved tool outputs to {workspace / TASK_OUTPUTS_DIR}.\n"
        f"The session log is {agent.log.path}. "
        "Open them to see what each layer removed, and where it went.",
        "title")
    said, address = report_line(agent.log.path)
    say(said, "title")
    agent.out.flush()
    print(printable(address))  # whole, to copy or click, however narrow the terminal
    agent.out.flush()
    return 0


def play_step(code, agent, fake, messages, title, what, prompt, script, say) -> None:
    say(f"\n== {title}: {what} ==", "title")
    before_files = files_under(agent.workdir)
    before_stats = {name: dict(figures) for name, figures in agent.stats.items()}
    started, first_request = time.monotonic(), len(fake.requests)
    fake.replies.clear()
    fake.reply(*script.get("replies", []))
    fake.summary(*script.get("summaries", []))
    if prompt.startswith("/"):
        for _ in range(script["commands"]):
            # new work first: a summary of a summary frees nothing
            if script.get("between"):
                say(f"s08 >> {script['between']}")
                code.take_turn(agent, messages, script["between"])
            say(f"s08 >> {prompt}")
            handle_command(agent, messages, prompt, code.LESSON)
    else:
        for turn in range(script.get("turns", 1)):
            asked = prompt if turn == 0 else f"Go on with part {turn}"
            say(f"s08 >> {asked}")
            code.take_turn(agent, messages, asked)
    new_files = [str(p.relative_to(agent.workdir)) for p in  # in the order they were written
                 sorted(files_under(agent.workdir) - before_files,
                        key=lambda p: p.stat().st_mtime_ns)]
    acted = []  # what each layer did in this step alone: a whole step also adds new content
    for name, figures in agent.stats.items():
        runs = figures["runs"] - before_stats.get(name, {}).get("runs", 0)
        saved = figures["saved"] - before_stats.get(name, {}).get("saved", 0)
        if runs:
            acted.append(f"{name} {runs}× −{format_tokens(saved)}")
    # the request the endpoint refused, beside what we had estimated it at
    if script.get("refusal"):
        refused = fake.requests[first_request]
        system_and_tools = agent.system + json.dumps(definitions(agent.tools))
        ours = (code.estimate_text_tokens(system_and_tools)
                + code.estimate_tokens(refused["messages"]))
        say(f"   the endpoint refused a request we had estimated at {ours:,} tokens, "
            f"saying \"{REFUSAL}\". "
            "Here the refusal is scripted, to show reactive_compact; "
            "a real endpoint refuses when its own "
            "tokenizer counts more than our estimate (about 4 characters a token) "
            "or its window is smaller than the one configured. "
            "The program learns from the numbers in the error, then compacts.", "dim")
    now, s = code.context_tokens(agent, messages), agent.settings
    say(f"   this step: {', '.join(acted) or 'no layer acted'}; "
        f"the context is now {now:,} tokens, "
        f"{100 * now // s.threshold}% of the {s.threshold:,}-token threshold "
        "(snip and micro act past "
        f"{s.micro_trigger:,}, a summary past {s.threshold:,}); "
        f"{time.monotonic() - started:.1f}s", "dim")
    for path in new_files[:6]:
        say(f"   wrote {path}", "dim")
    if len(new_files) > 6:
        say(f"   ... and {len(new_files) - 6} more files", "dim")
