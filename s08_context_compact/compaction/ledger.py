"""The fact ledger: a plug-in on the hooks that records what actually happened (files
read and written, commands and their exit codes, failing tests, the user's constraints),
puts it back after every compaction, and checks what the summary kept.

The chapter does not need its inside; it shows how hooks extend the agent: ledger_hooks
answers four events (PostToolUse, UserPromptSubmit, RestoreContext, PostCompact), and
what fires them knows nothing of the ledger. summary.py, beside it, fits the ledger's
lines into what comes back after a summary.
"""

import hashlib
import re
from pathlib import Path
from typing import NamedTuple

from ..basics import inside_workspace, Redactor

MAX_WRITTEN_LISTED = 60              # paths in the line of files written
# the end of the latest failed command's output, put back after a summary
FAILURE_TAIL_CHARS = 800
# a user line with one of these is a constraint
CONSTRAINT_WORDS = re.compile(r"\b(must|mustn't|don't|do not|never|always)\b"
                              r"|必须|不要|不能|不许|禁止|务必|永远|总是",
                              re.IGNORECASE)


def short_hash(path: Path) -> str:
    size = path.stat().st_size
    data = (path.read_bytes() if size <= 8_000_000
            else f"{size}:{path.stat().st_mtime_ns}".encode())
    return hashlib.sha1(data).hexdigest()[:8]


def summary_mentions(key: str, summary: str) -> bool:
    """Whether a summary still carries a fact: most of its words (or CJK characters) appear."""
    lowered = summary.lower()
    # a path or test id: its last part is what counts
    if " " not in key and ("/" in key or "::" in key):
        return re.split(r"/|::", key)[-1].lower() in lowered
    parts = (re.findall(r"[a-z0-9_.-]{3,}", key.lower())
             + sorted(set(re.findall(r"[\u3040-\u9fff]", key))))
    return bool(parts) and sum(part in lowered for part in parts) >= 0.6 * len(parts)


class Ledger:
    """Files read and written, commands and exit codes, failing tests,
    and the user's constraints."""

    def __init__(self):
        self.reads = {}        # path -> (size, mtime_ns, hash), the most recent read last
        self.writes = {}       # path -> (size, hash)
        self.commands = []     # (command, exit code)
        self.failing = {}      # test ids seen failing, in order
        self.constraints = []  # the user's lines with must / never / 必须 ..., verbatim
        # (command, exit code, the end of its output): what the model would run again to see
        self.last_failure = None

    def note_read(self, path: str, target: Path) -> None:
        self.reads.pop(path, None)
        self.reads[path] = (target.stat().st_size, target.stat().st_mtime_ns, short_hash(target))

    def note_write(self, path: str, target: Path) -> None:
        self.writes.pop(path, None)  # the most recent write last
        self.writes[path] = (target.stat().st_size, short_hash(target))

    def note_command(self, command: str, output: str) -> None:
        code = re.search(r"\[exit code (\d+)\]$", output)
        timed_out = re.search(r"\[timed out after \d+s", output)
        self.commands.append((command,
                              "timeout" if timed_out else int(code.group(1)) if code else 0))
        if self.commands[-1][1] != 0:
            self.last_failure = (command, self.commands[-1][1], output[-FAILURE_TAIL_CHARS:])
        elif self.last_failure and self.last_failure[0] == command:
            self.last_failure = None  # it passes now: its old error is no news
        for test in re.findall(r"^(?:FAILED|ERROR) (\S+)|^--- FAIL: (\S+)", output, re.M):
            self.failing[test[0] or test[1]] = True

    def note_prompt(self, prompt: str) -> None:
        for line in re.split(r"(?<=[.!?。！？])\s+|\n", prompt):
            if CONSTRAINT_WORDS.search(line) and line.strip() not in self.constraints:
                self.constraints = (self.constraints + [line.strip()[:300]])[-20:]

    def facts(self, todos: list) -> list:
        """Every fact as (what it is, the words a summary that kept it would contain)."""
        facts = [("read", p) for p in self.reads] + [("wrote", p) for p in self.writes]
        facts += [("failing test", t) for t in self.failing]
        facts += [("failed command", c) for c, code in self.commands if code != 0]
        facts += [("constraint", c) for c in self.constraints]
        facts += [("todo", t["content"]) for t in todos]
        return list(dict.fromkeys(facts))

    def check(self, summary: str, todos: list) -> tuple:
        """(facts the summary kept, all facts, the ones it lost)."""
        facts = self.facts(todos)
        lost = [f for f in facts if not summary_mentions(f[1], summary)]
        return len(facts) - len(lost), len(facts), lost

    def lines(self) -> list:
        """The ledger as lines, what matters most last: the newest lines are the ones kept
        when room is short. The files written are one line of paths, however many."""
        lines = [f"- read {p} ({size:,} bytes, {h})" for p, (size, _, h) in self.reads.items()]
        lines += [f"- ran `{c[:120]}` → exit {code}" for c, code in self.commands[-10:]]
        lines += [f"- saw failing test {t}" for t in self.failing]
        if self.writes:
            lines.append("- wrote or edited (oldest first): "
                         + ", ".join(list(self.writes)[-MAX_WRITTEN_LISTED:]))
        lines += [f"- the user said: \"{c}\"" for c in self.constraints]
        if self.last_failure:
            command, code, tail = self.last_failure
            lines.append(f"- the latest failed command, `{command[:120]}` (exit {code}), "
                         "ended with:\n"
                         + "\n".join(f"    {line}" for line in tail.splitlines()))
        return lines


def listed(keys: str, max_chars: int) -> str:
    """A "; "-separated list cut at a separator, saying how many more there were."""
    if len(keys) <= max_chars:
        return keys
    shown = keys[:max_chars].rsplit("; ", 1)[0]
    return f"{shown}; and {keys.count('; ') - shown.count('; ')} more"


class ForTheLedger(NamedTuple):
    """What the ledger's hooks read of the session, as it is when they run."""
    workdir: Path
    ledger: "Ledger"
    secrets: Redactor
    todos: list


def ledger_hooks() -> dict:
    """The ledger as a plug-in on the hooks: it records after each tool call and each user
    prompt, puts itself back after a summary (RestoreContext), and checks what the summary
    kept (PostCompact). Each hook(event, now) is handed what it reads as a ForTheLedger, as
    it is when it runs (/clear puts in a new ledger and todo list)."""
    def after_tool(event: dict, now: ForTheLedger):
        tool, args = event.get("tool"), event["input"]
        workdir, ledger, secrets = now.workdir, now.ledger, now.secrets
        if event["is_error"] or tool is None:
            return None
        path = args.get(tool.writes or tool.reads)  # what the tool's declaration says it touches
        if isinstance(path, str):
            target = inside_workspace(workdir, path)
            if target and target.is_file():
                (ledger.note_write if tool.writes else ledger.note_read)(path, target)
        if isinstance(args.get(tool.runs), str):
            # redacted whole, before its end is kept: no piece of a secret is left at the cut
            ledger.note_command(secrets.redact(args[tool.runs]), secrets.redact(event["output"]))
        return None

    def on_prompt(event: dict, now: ForTheLedger):
        now.ledger.note_prompt(event["prompt"])
        return None

    def restore(event: dict, now: ForTheLedger):
        return {"what": "fact ledger",
                "heading": "Fact ledger (recorded from tool calls and the user's words, "
                           "not from the summary):",
                "lines": now.ledger.lines()}

    def check(event: dict, now: ForTheLedger):
        # what the summary keeps, with the messages kept after it as they are
        # (a fact there is not lost)
        ledger, secrets, todos = now.ledger, now.secrets, now.todos
        kept, total, lost = ledger.check(event["summary"] + event.get("kept", ""), todos)
        # a todo may quote a secret: before the cut
        lost_keys = secrets.redact("; ".join(key for _, key in lost))
        missing = f" (not in the summary: {listed(lost_keys, 200)})" if lost else ""
        facts = f"{total} fact{'' if total == 1 else 's'}"
        return {"note": f"ledger check: the summary mentions {kept} of {facts} "
                        f"the hooks recorded{missing}; "
                        "the ledger itself is restored after it" if total else "",
                "ledger": {"retained": kept, "total": total,
                           "lost": [f"{kind}: {key}" for kind, key in lost]}}
    return {"PostToolUse": after_tool, "UserPromptSubmit": on_prompt,
            "RestoreContext": restore, "PostCompact": check}



