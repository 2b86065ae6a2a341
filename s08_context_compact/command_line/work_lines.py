"""What the program reports of its work: a line for each tool call and its result (an
edit with its -/+ lines), a line for what a compaction layer did, the /context report of
what fills the window, and the status line after a turn.

Machinery the chapter does not need. It words the lines; the agent's say hands them to
basics/terminal.py, which decides how they look, and what a layer did also goes to the
session log (session/session_log.py).
"""

import difflib
import json
import re

from ..messages import blocks_of
from ..basics import (INSTRUCTIONS_TAG, TOOL_RESULTS_DIR, counted, format_tokens, one_line,
                      terminal_columns, Tool)


TOOL_MARK = "●"
EDIT_DIFF_LINES = 6      # the −/+ lines shown of an edit; the rest is counted
# Characters of a result a one-line preview looks at (a result can be 200 KB).
PREVIEW_SCAN = 2_000
# How read_file numbers a line (workspace_files.numbered_lines).
NUMBERED_LINE = re.compile(r"^ *(\d+)\t(.*)$")


def show_tool_call(agent, name: str, args: dict) -> None:
    """One line as a call starts: "● bash  wc -l *.py",
    "● read_file  src/app.py (lines 1–200)"."""
    tool = agent.tools.get(name) or Tool(name, "", {})  # a name the model made up: its arguments
    agent.say(f"{TOOL_MARK} {name}  {main_argument(tool, args)}".rstrip(), "tool", cut=True)


def main_argument(tool: Tool, args: dict) -> str:
    """What a call is about, in a few words: the command, the path, the pattern (the argument
    the tool's declaration names, basics/tools.py)."""
    if not isinstance(args, dict):  # refused (tool_calls.py); shown as it came
        return one_line(json.dumps(args, ensure_ascii=False))
    name, path = tool.name, str(args.get(tool.path_argument, ""))
    if tool.reads and ("offset" in args or "limit" in args):
        first, limit = args.get("offset", 1), args.get("limit")
        if isinstance(first, int) and isinstance(limit, int):
            return f"{path} (lines {first}–{first + limit - 1})"
        return f"{path} (from line {first})"
    if tool.writes and "content" in args:
        lines = len(str(args.get('content', '')).splitlines())
        return f"{path} ({counted(lines, 'line')})"
    if tool.lists:
        where = f" in {path}" if path not in ("", ".") else ""
        return one_line(args.get(tool.main_argument, "")) + where
    if name == "todo_write":
        return counted(len(args.get("items") or []), "item")
    if tool.subagent:
        return one_line(args.get(tool.main_argument) or args.get("prompt", ""))
    if tool.main_argument:
        return one_line(args.get(tool.main_argument, ""))
    pairs = (f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in args.items())
    return one_line(" ".join(pairs))


def show_tool_result(agent, name: str, args: dict, output: str, failed: bool) -> None:
    """One line with a preview of the result (line numbers kept apart from the text); the
    todo list whole; for an edit, a few −/+ lines of what changed."""
    if failed:
        # Why it failed matters: a terminal cuts it to fit, not sooner.
        agent.say(f"  ✗ {lines_preview(output, 400)}", "error", cut=True)
    elif name == "todo_write":  # the list itself, an item a line, shown once
        agent.say("  " + output.replace("\n", "\n  "), "tool", cut=True)
    elif name == "edit_file":
        diff = edit_diff(str(args.get("old_text", "")), str(args.get("new_text", "")))
        agent.say("\n".join([f"  < {one_line(output)}"] + diff), "tool", cut=True)
    elif getattr(agent.tools.get(name), "reads", "") and (numbered := read_preview(output)):
        agent.say(f"  < {numbered}", "tool", cut=True)
    else:
        agent.say(f"  < {lines_preview(output)}", "tool", cut=True)


def lines_preview(text: str, width: int = 100) -> str:
    """Several lines as one, each still told from the next: "120 a.py ⏎ 30 b.py"."""
    lines = (line.strip() for line in text[:PREVIEW_SCAN].splitlines() if line.strip())
    return one_line(" ⏎ ".join(lines), width)


def read_preview(output: str) -> str:
    """read_file's numbered lines in one line: their range, then their text without the
    numbers, "lines 1–40: import os ⏎ import sys ⏎ …" ("" when not numbered lines)."""
    head = [match for line in output[:PREVIEW_SCAN].splitlines()
            if (match := NUMBERED_LINE.match(line))]
    # The tail's first line may start mid-line.
    tail = [match for line in output[-PREVIEW_SCAN:].splitlines()[1:]
            if (match := NUMBERED_LINE.match(line))]
    if not head:
        return ""
    more = " (more follow)" if "[more lines follow;" in output[-200:] else ""
    return f"lines {head[0].group(1)}–{(tail or head)[-1].group(1)}{more}: " + \
        lines_preview("\n".join(match.group(2) for match in head))


def edit_diff(old: str, new: str) -> list:
    """What an edit changed, as a few "− old" / "+ new" lines; lines both sides share are
    left out, and a long change is cut with a count of the rest."""
    # Bounded work for a huge edit.
    old_lines, new_lines = old.splitlines()[:500], new.splitlines()[:500]
    changed = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_lines, new_lines).get_opcodes():
        if tag != "equal":
            changed += [f"    − {line}" for line in old_lines[i1:i2]]
            changed += [f"    + {line}" for line in new_lines[j1:j2]]
    if len(changed) <= EDIT_DIFF_LINES:
        return changed
    rest = counted(len(changed) - EDIT_DIFF_LINES, 'more changed line')
    return changed[:EDIT_DIFF_LINES] + [f"    … {rest}"]


LAYER_VERBS = {"tool_result_budget": "large results → disk + preview",
               "snip_compact": "middle messages snipped",
               "micro_compact": "old results → placeholders",
               "compact_history": "messages → summary",
               "reactive_compact": "messages → summary + recent tail"}


def count_changes(name: str, before: list, after: list) -> int:
    """How many messages (or, for the result layers, tool results) a layer changed."""
    if name in ("compact_history", "reactive_compact"):
        return len(before)
    if name == "snip_compact":
        return len(before) - len(after)  # the marker joins an existing message
    changed = 0
    for old, new in zip(before, after):
        if old is not new:  # layers copy only what they change
            changed += sum(x is not y for x, y in zip(blocks_of(old), blocks_of(new)))
    return changed


def show_layer(agent, name: str, before: list, after: list, saved: int, written: list,
               seconds: float = 0.0) -> None:
    """What a layer did, counted (the session's stats: /context shows them), said and logged.
    written is what the run saved; the result layers may point at a copy saved earlier, so
    they name the folder, not new files. seconds: how long the loop spent in it."""
    record = agent.stats.setdefault(name, {"runs": 0, "saved": 0, "seconds": 0.0})
    record["runs"] += 1
    record["saved"] += saved
    record["seconds"] += seconds
    where = [str(path) for path in written if path.suffix == ".jsonl"] or [TOOL_RESULTS_DIR + "/"]
    agent.say(layer_line(name, before, after, saved, where), "layer")
    if agent.log:
        agent.log.layer(name, where, saved, seconds)


def layer_line(name: str, before: list, after: list, saved: int, where: list) -> str:
    """What a layer did: "[micro_compact] 3 old results → placeholders, −2.1k tokens (...)";
    for a summary, who wrote it, its first lines, and what the hooks found in it."""
    change = f"−{format_tokens(saved)}" if saved >= 0 else f"+{format_tokens(-saved)}"
    changed = count_changes(name, before, after)
    verb = LAYER_VERBS[name]
    if changed == 1:
        verb = re.sub(r"^((?:\w+ )?\w+)s\b", r"\1", verb).replace("placeholders", "a placeholder")
    line = f"[{name}] {changed} {verb}, {change} tokens (saved to {', '.join(where)})"
    # A summary written by this run, not an old one kept.
    new_first = after and not (before and after[0] is before[0])
    first = blocks_of(after[0])[0] if new_first else None
    header = first if first and "summary_by" in first else None
    if not header:
        return line
    summary = header["text"].split("\n\n", 1)[-1]
    lines = [f"    {one_line(text, 120)}" for text in summary.splitlines() if text.strip()][:3]
    checks = [f"    {c}" for c in header["checks"]]
    return "\n".join([f"{line}; summary by {header['summary_by']}"] + lines + checks)


def billed_input(usage: dict, ttl: str = "5m") -> float:
    """Input tokens as the price list sees them: cache reads 0.1×, cache writes 1.25× (2× for
    an hour)."""
    write_price = 2.0 if ttl == "1h" else 1.25
    return (usage.get("input_tokens", 0)
            + write_price * usage.get("cache_creation_input_tokens", 0)
            + 0.1 * usage.get("cache_read_input_tokens", 0))


def bar(tokens: int, window: int, width: int = 20) -> str:
    filled = min(width, round(width * tokens / max(window, 1)))
    return "█" * filled + "░" * (width - filled)


INSTRUCTIONS = re.compile(f'<{INSTRUCTIONS_TAG} file="([^"]+)">.*?</{INSTRUCTIONS_TAG}>', re.S)


def context_parts(agent, messages: list, total: int, measure) -> dict:
    """What fills the context, by kind, in tokens that add up to total: the split between
    kinds is estimated, the total is the counter's (exact up to the last response)."""
    estimated = {"system prompt + tools": agent.overhead}
    # AGENTS.md, a part of the system prompt of its own.
    if found := INSTRUCTIONS.search(agent.system):
        size = min(measure(found.group(0)), agent.overhead)
        estimated[f"instructions ({found.group(1)})"] = size
        estimated["system prompt + tools"] -= size
    estimated.update({"user text": 0, "assistant text": 0, "tool calls": 0, "tool results": 0})
    for message in messages:
        for block in blocks_of(message):
            kinds = {"text": f"{message['role']} text", "tool_use": "tool calls"}
            kind = kinds.get(block.get("type"), "tool results")
            estimated[kind] += measure(json.dumps(block, ensure_ascii=False))
    scale = total / max(sum(estimated.values()), 1)
    parts = {kind: int(n * scale) for kind, n in estimated.items()}
    # The rounding goes to the largest.
    parts[max(parts, key=parts.get)] += total - sum(parts.values())
    return parts


def context_breakdown(agent, messages: list, total: int, measure) -> str:
    """What /context prints: what fills the window, part by part (parts add up to total),
    so the rows add up to the window; then the thresholds, the cache and the savings."""
    s = agent.settings
    if agent.state.counter.anchor_tokens:
        how = "exact up to the last response, split by estimate"
    else:
        how = "estimated"
    rows = {**context_parts(agent, messages, total, measure),
            "free until auto-compact": max(s.threshold - total, 0),
            "reserved: output + buffer": max(s.window - max(total, s.threshold), 0)}
    lines = [f"Context: {counted(len(messages), 'message')}, "
             f"{total:,} tokens of a {s.window:,}-token window "
             f"({100 * total / s.window:.0f}%; {how})"]
    # On a narrow terminal the bar gives way first.
    bar_width = min(20, (terminal_columns(agent.fit_width) or 80) - 45)
    for name, n in rows.items():
        drawn = f"  {bar(n, s.window, bar_width)}" if bar_width >= 4 else ""
        lines.append(f"  {name:<26}{n:>9,}{drawn} {100 * n / s.window:>3.0f}%")
    lines += settings_lines(agent)
    lines += cache_lines(agent)
    lines.append(f"Commands: sandbox {agent.sandbox.describe()}")
    lines.append("Saved so far:")
    for name in LAYER_VERBS:
        record = agent.stats.get(name, {})
        # the summaries' time is the loop's wait for them: a summary written ahead cuts it
        took = f" in {record['seconds']:.1f}s" if record.get("seconds", 0) >= 0.05 else ""
        lines.append(f"  {name:<20}{record.get('runs', 0):>4}×  "
                     f"−{format_tokens(record.get('saved', 0))}{took}")
    if waiting := agent.snips.describe(messages):  # cut by snip, out of view until summarized
        lines.append(waiting)
    return "\n".join(lines)


def settings_lines(agent) -> list:
    """The window and where it came from, where auto-compact starts and why, the summary
    written ahead, and when the cheap layers run."""
    s, endpoint = agent.settings, agent.endpoint
    counts = "; the endpoint counts max_tokens against it" if endpoint.counts_output else ""
    if endpoint.undercount > 1:  # learned from a "too long": every estimate is scaled by it
        counts += (f"; it counted {endpoint.undercount:.1f} times this program's estimate, so "
                   "every estimate is scaled up")
    lines = [f"Window: {s.window:,} tokens, from {endpoint.window_source}{counts}"]
    if endpoint.usage_note:
        lines.append(f"Usage: {endpoint.usage_note}")
    lines.append(f"Auto-compact above {format_tokens(s.threshold)} tokens ({threshold_reason(s)})")
    if agent.writer.stopped:  # the breaker is open
        failed = agent.writer.breaker.failures
        lines.append(f"Summaries: {failed} failed in a row, so none is asked for this session; "
                     "compaction uses summaries built without the model")
    else:
        said = agent.ahead.describe(agent.settings)
        lines.append(said[0].upper() + said[1:])
    lines.append(f"Cheap layers: tool results ≤ {s.budget_chars:,} chars a message; "
                 f"above {format_tokens(s.micro_trigger)} tokens, "
                 f"snip past {s.snip_keep_head + s.snip_keep_tail} messages "
                 f"({s.snip_at_least}+ at a time) "
                 f"and micro_compact (clearing {format_tokens(s.clear_at_least)}+, "
                 f"keeping the newest {s.keep_recent})")
    return lines


def threshold_reason(s) -> str:
    """Why auto-compact starts where it does: COMPACT_AT's share of the window, or the window
    less the output and a buffer."""
    if s.compact_at and s.threshold == int(s.window * s.compact_at):
        return f"{s.compact_at:.0%} of the window, COMPACT_AT"
    buffer = s.window - s.max_output - s.threshold
    how = f"window − {format_tokens(s.max_output)} output − {format_tokens(buffer)} buffer"
    if s.compact_at:
        how += f"; COMPACT_AT={s.compact_at:g} would come later, so it is held here"
    return how


def all_input(usage: dict) -> int:
    """Every input token of a usage: uncached, read from the cache and written to it."""
    return (usage["input_tokens"] + usage["cache_read_input_tokens"]
            + usage["cache_creation_input_tokens"])


def cache_lines(agent) -> list:
    """The prompt cache on the last request, and what the session's input was billed as."""
    last = agent.state.last_usage
    if not last:
        return []
    sent = all_input(last)
    totals = agent.usage_totals
    read, written = last["cache_read_input_tokens"], last["cache_creation_input_tokens"]
    billed = format_tokens(int(billed_input(totals, agent.settings.cache_ttl)))
    return [f"Prompt cache, last request: {100 * read // max(sent, 1)}% read "
            f"({format_tokens(read)} read, {format_tokens(written)} written, "
            f"{format_tokens(last['input_tokens'])} uncached)",
            f"Session input: {format_tokens(all_input(totals))} tokens sent, billed as {billed}"]


def status_line(settings, used: int, exact: bool = True) -> str:
    """How full the context is ("≈" when it is our estimate, not the endpoint's count: after
    a compaction, say), and how far auto-compact is."""
    left = settings.threshold - used
    if left > 0:
        until = f"auto-compact in {format_tokens(left)}"
    else:
        until = "over the auto-compact threshold: it compacts before the next call"
    approx = "" if exact else "≈"
    return (f"context {approx}{format_tokens(used)}/{format_tokens(settings.window)} tokens "
            f"({100 * used / settings.window:.0f}%) · {until}")
