#!/usr/bin/env python3
"""s08: context compact. A coding agent that keeps working when its context fills up.

Before every model call the history goes through a pipeline, cheapest layer first (README.md
draws it): tool_result_budget, snip_compact, micro_compact, then compact_history if still over
the threshold; reactive_compact when the endpoint says the prompt is too long.

Nothing is thrown away: every layer writes what it removes to .task_outputs/tool-results/
or .transcripts/ before it removes it, and the session log keeps every message.

This file is the chapter, read top to bottom beside README.md: part 1 is new here, part 2
is what earlier chapters built, part 3 a short main. The machinery the chapter does not
need lives in the folders beside it, one folder a role (each has a README).

    python s08_context_compact/code.py          # needs ANTHROPIC_API_KEY (or _AUTH_TOKEN), MODEL_ID
    python s08_context_compact/code.py --demo   # watch every layer fire, offline, no key
"""

import json
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

# Run as a script, this folder comes first on sys.path. There code.py would stand in for the
# standard library's `code`, which pdb imports. So the folder comes off sys.path, and the
# folders beside this file are loaded as the package they are.
if not __package__:
    from importlib import util
    HERE = Path(__file__).resolve().parent
    sys.path[:] = [folder for folder in sys.path if Path(folder or ".").resolve() != HERE]
    spec = util.spec_from_file_location("s08_context_compact", HERE / "__init__.py")
    spec.loader.exec_module(sys.modules.setdefault(spec.name, util.module_from_spec(spec)))

from s08_context_compact.basics import (
    edit_file, glob_files, one_line, path_risk, read_lines, redact, Tool, ToolCall, ToolError,
    workspace_path, write_file)
from s08_context_compact.messages import (
    append_message, current_request, estimate_text_tokens, estimate_tokens,
    is_tool_result_message, newest_groups, OWN, paths_read, replace_history, result_text,
    snip_bounds, todo_problem, tool_names, tool_results, with_blocks, with_snip_note)
from s08_context_compact.endpoint import (
    api_failures, ContextOverflow, count_tokens, make_reply_sendable, marked_request,
    model_reply)
from s08_context_compact.compaction import (
    nothing_to_summarize, pointed_to, previewed, render_todos, replace_with_summary,
    summary_marks, what_comes_back)
from s08_context_compact.safety import (
    command_risks, run_command)
from s08_context_compact.command_line import (
    add_prompt, configure, count_call, Lesson, park_long_inputs, park_oversized_request, run,
    run_tool_calls, say_status, show_layer, start_session, turn_failed)


# ==== PART 1: THE CHAPTER ========================================================================

# ---- the numbers the lesson uses -----------------------------------------------------------------
# Every size in tokens comes from the context window: compaction/settings.py derives them all
# (Settings.for_window, with the chapter's defaults as ceilings; the chapter's table gives each
# rule). These are the other numbers the code below uses.
COUNT_TOKENS_MARGIN = 0.1           # this close to the threshold, ask the API for the exact count
COLD_TRIGGER_SHARE = 0.5            # snip and micro trigger at this share of micro_trigger
                                    # once the prompt cache has expired (CACHE_TTLS)
PLACEHOLDER_TOKENS = 60             # a placeholder's size, long path included; rather too high
MAX_REACTIVE_RETRIES = 1            # refused again with nothing new learned: the turn ends
REACTIVE_TAIL_SHARE = 0.25          # reactive_compact keeps recent messages up to this share
# The program marks its own blocks with a field, OWN, whose value names the kind ("preview",
# "placeholder", ...), never by their text alone: a user may type any text. The field is
# stripped from every request.


# ---- the agent -----------------------------------------------------------------------------------
# Layers, and the functions choosing what stays after a summary, take the history (plain dicts
# in the API's wire format); the others take the Agent (command_line/agent.py, where each field
# says what it holds: `settings` has every size in tokens, `state` what one loop learns).
# fire_hooks (part 2) runs an event's hooks: this chapter adds PreCompact, RestoreContext and
# PostCompact.

# ---- the request, and counting its tokens --------------------------------------------------------

def build_request(agent, messages: list, extra_text: str | None = None) -> dict:
    """The Messages API request for a history: tools and system first, then the messages, with
    the prompt cache's marks (endpoint/prompt_cache.py places them: four at most)."""
    s = agent.settings
    return marked_request(s.model, s.max_output, agent.system, agent.tools, messages,
                          keep_recent=s.keep_recent, ttl=s.cache_ttl, extra_text=extra_text)


def context_tokens(agent, messages: list) -> int:
    """Tokens the next request will carry: exact up to the last response, estimated after."""
    return agent.state.counter.count(messages, agent.overhead)


def over_threshold(agent, messages: list) -> bool:
    """Compare with the threshold; near it, the endpoint's exact count decides, if it offers
    one (count_tokens), rather than an estimate."""
    s = agent.settings
    tokens = context_tokens(agent, messages)
    if abs(tokens - s.threshold) <= s.threshold * COUNT_TOKENS_MARGIN:
        counted = count_tokens(agent.connection, build_request(agent, messages), tokens)
        if counted is not None:
            agent.state.counter.anchor(counted, messages)
            tokens = counted
    return tokens > s.threshold


# ---- the prompt cache: why the cheap layers wait ------------------------------------------------
# A change rewrites the cache after it: cut a lot at once, or when the cache has expired.

def cache_is_cold(agent) -> bool:
    """Whether the last reply came so long ago that the endpoint's prompt cache has expired."""
    if agent.state.last_reply_at is None:
        return False
    return agent.clock() - agent.state.last_reply_at > agent.settings.cache_seconds


# ---- the three cheap layers ----------------------------------------------------------------------
# Each takes the history and returns a new list, or the very list it was given when nothing
# changed (apply_layer tells them apart with `is`); what it removes it first saves through the
# store (compaction/store.py). A message it changes it copies, never edits: the token count
# reuses what it measured of a message still there. previewed, pointed_to: compaction/previews.py.

def tool_result_budget(messages: list, *, max_chars: int, preview_chars: int, store) -> list:
    """Keep the newest message's tool results under max_chars; the largest go to disk first."""
    newest = tool_results(messages, start=len(messages) - 1)  # (message index, block index): result
    sizes = {at: len(result_text(b)) for at, b in newest.items()}
    total = sum(sizes.values())
    previews = {}  # the same keys: the preview in the result's place
    for at in sorted(sizes, key=sizes.get, reverse=True):
        if total > max_chars:
            previews[at] = previewed(newest[at], preview_chars, store)
            total -= sizes[at] - len(result_text(previews[at]))
    return with_blocks(messages, previews)  # the same list if no preview was smaller


def snip_compact(messages: list, *, keep_head: int, keep_tail: int, at_least: int,
                 min_tokens: int = 0, store, tools: dict, measure=estimate_tokens) -> list:
    """Drop the middle of a long history, never splitting a tool_use from its tool_result."""
    # Every snip changes the head, so the cache is rewritten after it: cut at least
    # `at_least` messages holding `min_tokens` at once, so that the rewrite pays. Both cut
    # points fall just before a call, never inside a pair (messages/history.py).
    bounds = snip_bounds(messages, keep_head, keep_tail, at_least)
    if bounds is None:
        return messages
    head_end, tail_start = bounds
    removed = messages[head_end:tail_start]
    if measure(removed) < min_tokens:
        return messages  # too little to pay for rewriting the cache after the head
    path = store.save_messages(removed, "snip")
    # One note, folded into the head (messages/history.py): what went, where, what it did. The
    # user's current request, if it went, stays in view verbatim.
    result = with_snip_note(messages, head_end, tail_start, path, tools)
    return result if measure(result) < measure(messages) else messages


def micro_compact(messages: list, *, keep_recent: int, min_chars: int, clear_at_least: int,
                  store) -> list:
    """Replace all but the newest tool results with a pointer to their saved copy."""
    results = list(tool_results(messages).items())
    # the newest keep_recent stay, and those in the last message: the model has not seen them
    old = results[:max(0, len(results) - keep_recent)]
    stale = {at: b for at, b in old if at[0] < len(messages) - 1
             and len(result_text(b)) > min_chars and b.get(OWN) != "placeholder"}
    # Clearing rewrites the cache from the first cleared result on; below the minimum
    # the rewrite costs more than the tokens it frees, so clear nothing.
    freed = sum(estimate_text_tokens(result_text(b)) - PLACEHOLDER_TOKENS for b in stale.values())
    if not stale or freed < clear_at_least:
        return messages
    names, pointers = tool_names(messages), {}
    for at, block in stale.items():
        tool_use_id = block["tool_use_id"]
        if block.get(OWN) == "preview":  # its whole text is on disk already
            path = block.get("saved_at")
        else:
            path = store.save_output(tool_use_id, result_text(block))
        pointers[at] = pointed_to(block, names.get(tool_use_id, "tool"), path)
    # the same list if no pointer was smaller than its result (pointed_to hands the block back)
    return with_blocks(messages, pointers)


def apply_layer(agent, layer, messages: list, /, **settings) -> list:
    """Run one layer, and report what it did, once, by comparing the history before and after.
    Nothing may be removed unless it is on disk: if saving fails, the history stays as it is."""
    name, first_new, started = layer.__name__, len(agent.store.written), time.perf_counter()
    try:
        result = layer(messages, **settings)
    except OSError as err:
        if not agent.disk_warned:
            agent.say(f"[{name}] cannot save to disk ({err}); keeping content in context instead.")
            agent.disk_warned = True
        return messages
    if result is messages:
        return messages
    saved = agent.state.counter.estimate(messages) - agent.state.counter.estimate(result)
    seconds = time.perf_counter() - started  # the loop's time in it, a summary's call included
    # counted for /context, said, and logged (command_line/work_lines.py)
    show_layer(agent, name, messages, result, saved, agent.store.written[first_new:], seconds)
    return result


# ---- the summary: the model's, or one built without it -------------------------------------------
# compaction/summary_writer.py writes it; with the model or without, compaction succeeds.

def make_summary(agent, messages: list, focus: str, limit: int, asked=None) -> tuple:
    """(a summary of at most `limit` tokens, who wrote it: "the model" or "fallback"). `asked`
    is a reply asked for ahead (see "Compact before you must")."""
    written = agent.writer.write(messages, focus, limit, agent.settings, agent.state.counter,
                                 agent.state.todos, asked)
    agent.settings = agent.settings.resized(agent.endpoint.window)  # a "too long" taught it
    count_call(agent)  # what its calls cost: added up, and logged
    return written


# ---- what is summarized, the summary, what replaces it -------------------------------------------
# summarize_into, then its steps in the order it takes them. RestoreContext hooks put back what
# they keep (the fact ledger, compaction/ledger.py, does), then the user's recent words, the
# files read most recently, the todo list and the skills.

def summarize_into(agent, messages: list, tail: list, *, kind: str = "compact",
                   focus: str = "") -> list:
    """What is summarized (the whole history: its request shares the conversation's cache), the
    summary, what replaces it (`tail` stays verbatim after)."""
    focus = pre_compact_focus(agent, messages, focus)
    tail_tokens = estimate_tokens(tail)
    restored, limit = plan_restore(agent, messages, tail_tokens,
                                   shown=paths_read(tail, agent.tools))
    if kind == "compact" and nothing_to_summarize(messages, restored, tail_tokens,
                                                  slack=PLACEHOLDER_TOKENS):
        agent.say("[compact_history] nothing to compact: a summary would not make the context "
                  "smaller")
        return messages
    whole = agent.store.with_snipped(messages)  # and what snip cut, read back
    summary, source = make_summary(agent, whole, focus, limit)
    return with_summary(agent, messages, kind, (summary, source), tail, restored)


def pre_compact_focus(agent, messages: list, focus: str = "") -> str:
    """The focus, with what PreCompact hooks add to the summary's instructions."""
    for extra in fire_hooks(agent, "PreCompact", messages=messages, focus=focus):
        focus = " ".join(filter(None, [focus, extra.get("instructions", "")]))
    return focus


def plan_restore(agent, messages: list, tail_tokens: int, shown: set = frozenset()) -> tuple:
    """(what comes back, the tokens that leaves the summary): compaction/summary.py sizes
    each part, all together under a quarter of the window."""
    restorable = agent.restorable(fire_hooks(agent, "RestoreContext"))  # and the reads, todos...
    fixed = agent.overhead + tail_tokens  # sent with the summary, whatever it says
    return what_comes_back(messages, restorable, agent.settings, fixed, shown)


def with_summary(agent, messages: list, kind: str, written: tuple, tail: list,
                 restored: list, pending: tuple = ()) -> list:
    """The history replaced by the summary, what comes back, the request, then the tail.
    Only a swap (swap_in) passes `pending`."""
    summary, source = written
    # PostCompact hooks check the summary (the ledger does); what they find is kept with it
    checks = fire_hooks(agent, "PostCompact", summary=summary, source=source, kept=json.dumps(tail))
    # who wrote it and what the checks found: on the transcript's footer and the summary's block
    footer, marks = summary_marks(summary, source, checks)
    # the whole history saved, then the summary, what comes back and the request (summary.py);
    # `pending`: what a snip cut that a summary written ahead did not see, read back next time
    result = replace_with_summary(messages, kind, summary, tail, restored, store=agent.store,
                                  preview_chars=agent.settings.preview_chars, footer=footer,
                                  pending=pending, marks=marks)
    if result is messages:
        agent.say(f"[{kind}] the summary came out no smaller than the history; the history is "
                  f"kept (transcript saved to {agent.store.last_transcript})")
        return messages
    agent.state.repeat_reads.forget()  # what was read is no longer in context as it was
    return result


# ---- the two summary layers ----------------------------------------------------------------------
# They take the history and their inputs as the cheap layers do. `summarize(messages, tail, *,
# kind, focus)` returns the new history: summarize_into bound to the agent, or a summary
# written ahead that already holds its answer (swap_in, bound to the agent and the summary).

def compact_tail(messages: list) -> list:
    """In the middle of a turn the last call and its results stay, so the model carries on."""
    if len(messages) >= 2 and is_tool_result_message(messages[-1]):
        return messages[-2:]
    return []


def compact_history(messages: list, *, summarize, focus: str = "") -> list:
    """Replace the history with a summary, what the work needs back, and the request."""
    return summarize(messages, compact_tail(messages), focus=focus)


def reactive_tail(messages: list, tail_tokens: int) -> list:
    kept = newest_groups(messages, tail_tokens)  # the newest stays, whatever it costs
    return [m for group in kept for m in group]


def reactive_compact(messages: list, *, summarize, tail_tokens: int) -> list:
    """After "prompt is too long": the same, keeping only the recent groups that fit in
    tail_tokens (a share of the threshold, smaller when the endpoint counted more than we
    estimated)."""
    return summarize(messages, reactive_tail(messages, tail_tokens), kind="reactive")


# ---- when the endpoint says the prompt did not fit -----------------------------------------------
# model_reply raises ContextOverflow, whatever the wording (endpoint/overflow.py).

def adopt_overflow(agent, err: ContextOverflow) -> bool:
    """Learn from an overflow what the endpoint's window really is, and size every threshold
    to it; True when the window shrank."""
    before, learned = agent.endpoint.window, agent.endpoint.learn_from(err)
    if learned:
        agent.say(learned, "layer")
    agent.settings = agent.settings.resized(agent.endpoint.window)
    return agent.endpoint.window < before


# ---- the summary layers as the pipeline runs them ------------------------------------------------
# Through apply_layer, with the summary asked for ahead when one is there to take: written_ahead
# is "Compact before you must", below.

def compact_now(agent, messages: list, focus: str = "") -> list:
    """compact_history through apply_layer: at the threshold, for /compact, the compact tool."""
    summarize = written_ahead(agent, messages, focus=focus) or partial(summarize_into, agent)
    return apply_layer(agent, compact_history, messages, summarize=summarize, focus=focus)


def compact_on_overflow(agent, messages: list) -> list:
    """reactive_compact through apply_layer: the tail's size is a share of the threshold,
    smaller when the endpoint counts more tokens than we estimate."""
    tail_tokens = int(agent.settings.threshold * REACTIVE_TAIL_SHARE / agent.endpoint.undercount)
    summarize = written_ahead(agent, messages, max_suffix=tail_tokens) or \
        partial(summarize_into, agent)
    return apply_layer(agent, reactive_compact, messages, tail_tokens=tail_tokens,
                       summarize=summarize)


# ---- putting it together: the pipeline -----------------------------------------------------------

def compact_pipeline(agent, messages: list) -> list:
    """The four layers in order: cheap ones first, the summary (a call or a few) only when
    still over the threshold. (The fifth, reactive_compact, runs when the endpoint refuses.)"""
    s, store = agent.settings, agent.store
    # Budget runs first: it saves big new results before anything else could shorten them.
    messages = apply_layer(agent, tool_result_budget, messages, max_chars=s.budget_chars,
                           preview_chars=s.preview_chars, store=store)
    # snip and micro wait for their trigger, which is lower once the cache is cold. Past the
    # threshold, while a summary that may come too late is being written, micro clears all it can.
    cold = cache_is_cold(agent)
    late = not cold and agent.ahead.may_be_late(s) and over_threshold(agent, messages)
    if context_tokens(agent, messages) > s.micro_trigger * (COLD_TRIGGER_SHARE if cold else 1):
        # snip stops where a part agent.snips is already summarizing ends
        keep_tail = agent.snips.keep_tail(messages, s.snip_keep_tail)
        messages = apply_layer(agent, snip_compact, messages, keep_head=s.snip_keep_head,
                               keep_tail=keep_tail, at_least=s.snip_at_least,
                               min_tokens=0 if cold else s.snip_min_tokens, store=store,
                               tools=agent.tools, measure=agent.state.counter.estimate)
        messages = apply_layer(agent, micro_compact, messages, keep_recent=s.keep_recent,
                               min_chars=s.micro_min_chars, store=store,
                               clear_at_least=0 if cold or late else s.clear_at_least)
    messages = agent.snips.joined(messages)  # what snip cut, summarized since: at the end
    if over_threshold(agent, messages):
        messages = compact_now(agent, messages)
    return messages


# ---- compact before you must: a summary written ahead --------------------------------------------
# Asked for at an early mark, on a thread of its own (compaction/summary_ahead.py); taken at
# the threshold, where the loop waits only for what is left of it.

def summarize_ahead(agent, messages: list) -> None:
    """Past the early mark, ask for the summary of the history as it stands, in the
    background; what follows until the threshold stays verbatim, so it leaves that room."""
    tokens = context_tokens(agent, messages)
    if not agent.ahead.due(messages, tokens, agent.settings) or agent.writer.breaker_open():
        return
    focus = pre_compact_focus(agent, messages)
    # the tail it plans for: what may come until the threshold, kept verbatim after the swap
    _, limit = plan_restore(agent, messages, agent.settings.threshold - tokens)
    whole = agent.store.with_snipped(messages)  # and what snip cut, read back
    request = agent.writer.request_ahead(whole, focus, limit, agent.settings, agent.state.counter)
    if request:  # None: too big for one request, so written in pieces at the threshold
        agent.ahead.start(messages, *request, about=(focus, limit))


def written_ahead(agent, messages: list, focus: str = "", max_suffix: int | None = None):
    """A summarize that already holds its answer (swap_in), or None when there is no summary
    written ahead to take; agent.ahead.take waits for one still being written."""
    ready = agent.ahead.take(messages, agent.settings, agent.overhead,
                             agent.state.counter.estimate, focus, max_suffix=max_suffix)
    if ready is None:
        return None
    return partial(swap_in, agent, replace(ready, suffix=kept_after(agent, ready)))


def swap_in(agent, ready, messages: list, tail: list, *, kind: str = "compact",
            focus: str = "") -> list:
    """summarize_into with the summary in hand: the reply asked for ahead summarizes the
    snapshot, and what came after it stays verbatim as the tail. If that freed nothing, or not
    enough, the history is summarized now."""
    # Ready (compaction/summary_ahead.py): the reply (`asked`); the `snapshot`, with the `focus`
    # and `limit` set when it was asked for; the `suffix` after it and the `room` it may take;
    # and, if a snip cut past the snapshot, its `notes` and its transcripts (`pending`).
    kept = ready.suffix or tail
    restored, _ = plan_restore(agent, messages, estimate_tokens(kept),
                               shown=paths_read(kept, agent.tools))
    # the snapshot and what snip cut, read back: written from again if the reply was "too long"
    whole = agent.store.with_snipped(ready.snapshot)
    summary, source = make_summary(agent, whole, ready.focus, ready.limit, ready.asked)
    summary = "\n\n".join([summary, *ready.notes])
    result = with_summary(agent, messages, kind, (summary, source), kept, restored,
                          ready.pending)
    if kind == "compact" and (result is messages or over_threshold(agent, result)):
        result = summarize_into(agent, result, compact_tail(result))
    return result


def kept_after(agent, ready) -> list:
    """The suffix, shortened by the layers that cost no call (each saves what it removes
    first) when, kept whole, it would take more than its `room`: the room the next summary
    written ahead needs to be ready in time (summary_ahead.py)."""
    s, kept = agent.settings, ready.suffix
    if ready.room is None or estimate_tokens(kept) <= ready.room:
        return kept
    # No minimum to clear or cut: the swap rewrites the cache from the summary on anyway.
    kept = apply_layer(agent, micro_compact, kept, keep_recent=s.keep_recent,
                       min_chars=s.micro_min_chars, clear_at_least=0, store=agent.store)
    # snip keeps the first message (its note goes after it), and the newest groups that fit
    # the room: the last call and its results at least
    keep_tail = max(2, sum(map(len, newest_groups(kept, ready.room))))
    return apply_layer(agent, snip_compact, kept, keep_head=1, keep_tail=keep_tail, at_least=1,
                       store=agent.store, tools=agent.tools)


# ---- the agent loop ------------------------------------------------------------------------------

def call_model(agent, messages: list) -> tuple:
    """(assistant message, stop_reason), the text shown as it comes; or ContextOverflow."""
    answer = model_reply(agent.connection, build_request(agent, messages),
                         context_tokens(agent, messages), show_text=not agent.label)
    count_call(agent, answer)  # what it cost: added up, and logged
    reply, agent.state.last_reply_at = answer.message, agent.clock()
    if answer.prompt_tokens:  # usage is exact: it anchors the size of history + reply
        output = answer.usage.get("output_tokens") or agent.state.counter.size(reply)
        agent.state.counter.anchor(answer.prompt_tokens + output, messages + [reply])
    return reply, answer.stop_reason


def before_call(agent, messages: list) -> None:
    """The history made ready for the next call: tool inputs too big parked on disk, the
    pipeline run, summaries started in the background, read stubs kept true."""
    # a subagent may have learned the window
    agent.settings = agent.settings.resized(agent.endpoint.window)
    parked = park_long_inputs(agent, messages, estimate_text_tokens)
    replace_history(agent.log, messages, parked, "input parked")
    replace_history(agent.log, messages, compact_pipeline(agent, messages), "compaction")
    summarize_ahead(agent, messages)  # past the early mark: a summary starts in the background
    # and one of what snip cut, or will cut next, if none is being written
    agent.snips.summarize(messages, agent.settings, context_tokens(agent, messages))
    # a file read again unchanged got a stub, "as in result X": is X still there?
    stubs = agent.state.repeat_reads.kept_true(messages)
    replace_history(agent.log, messages, stubs, "read stubs re-pointed")


def agent_loop(agent, messages: list) -> str | None:
    """One user turn: compact, call the model, run its tools (part 2), until it stops calling."""
    reactive_retries = 0
    for _ in range(agent.max_steps):
        before_call(agent, messages)
        try:
            reply, stop_reason = call_model(agent, messages)
            reactive_retries = 0  # answered: a later "too long" in this turn is compacted again
        except ContextOverflow as err:
            shrank = adopt_overflow(agent, err)  # a smaller window: thresholds recomputed first
            if reactive_retries >= MAX_REACTIVE_RETRIES and not shrank:
                raise  # 1. compacted just now, nothing new learned: nothing more to free
            # a request or tool input too big for the window now goes to a file (it says where)
            request = current_request(messages)
            parked = park_oversized_request(agent, messages, request, estimate_text_tokens)
            replace_history(agent.log, messages, parked, "request parked")
            if shrank and context_tokens(agent, messages) <= agent.settings.threshold:
                continue  # 2. it fits the window learned: only the reply's room was too big
            reactive_retries += 1
            compacted = compact_on_overflow(agent, messages)
            replace_history(agent.log, messages, compacted, "reactive_compact")
            if not shrank and context_tokens(agent, messages) >= err.sent_tokens:
                raise  # 3. nothing was freed: sent again, the request would be refused again
            continue  # 4. compacted: sent again
        answer = take_reply(agent, messages, reply, stop_reason)  # part 2: it runs the tools
        if answer is not None:
            return answer
    then = ("the agent that gave it this task is told" if agent.label
            else "send a message to continue")  # no one can send a subagent a message
    agent.say(f"[stopped after {agent.max_steps} model calls in one turn; {then}]")
    return None


# ==== PART 2: WHAT EARLIER CHAPTERS BUILT ========================================================

# ---- the nine tools ------------------------------------------------------------------------------

BASH_TIMEOUT = 120          # seconds, unless the call asks for another (max 600)
READ_DEFAULT_LINES = 2_000


def schema(required: tuple, /, **properties) -> dict:
    """A tool's input as the API takes it: a JSON Schema of an object."""
    return {"type": "object", "properties": properties, "required": list(required)}


TEXT, NUMBER = {"type": "string"}, {"type": "integer"}
WORDS = {"type": "string", "pattern": r"\S"}  # a message of blank text is refused by the API
STATUS = {"type": "string", "enum": ["pending", "in_progress", "completed"]}
TODO_ITEM_SCHEMA = {"type": "object", "required": ["content", "status"],
                    "properties": {"content": TEXT, "status": STATUS}}
TIMEOUT = {"type": "integer", "description": f"seconds, default {BASH_TIMEOUT}, max 600"}


def take_reply(agent, messages: list, reply: dict, stop_reason: str) -> str | None:
    """The reply added to the history and its calls answered; its text when it called no tool
    and was not cut short, else None: the loop goes on."""
    reply, notes, refused = make_reply_sendable(reply, stop_reason,
                                                ids_used=set(tool_names(messages)),
                                                max_output=agent.settings.max_output)
    append_message(agent.log, agent.state.counter, messages, reply)
    tool_uses = [b for b in reply["content"] if b.get("type") == "tool_use"]
    if not tool_uses and notes:  # cut short: tell the model and let it go on
        append_message(agent.log, agent.state.counter, messages, {"role": "user", "content": notes})
        return None
    if not tool_uses:
        return "\n".join(b["text"] for b in reply["content"] if b.get("type") == "text")
    results, interrupted = use_tools(agent, tool_uses, refused, messages)
    append_message(agent.log, agent.state.counter, messages,
                   {"role": "user", "content": results + notes})
    if interrupted:
        agent.state.pending_compact = None  # an interrupted batch leaves nothing to do later
        raise KeyboardInterrupt
    if agent.state.pending_compact is not None:  # the compact tool asked: every call answered
        focus, agent.state.pending_compact = agent.state.pending_compact, None
        compacted = compact_now(agent, messages, focus)
        replace_history(agent.log, messages, compacted, "compact tool")
    return None


def use_tools(agent, tool_uses: list, refused: dict, history: list) -> tuple:
    """Run every call in order, each through the hooks (PreToolUse may deny it; PostToolUse
    sees its output); a refused call is answered with why, and after Ctrl-C every call left
    as interrupted (command_line/tool_calls.py). Returns (results, interrupted)."""
    return run_tool_calls(agent, fire_hooks, tool_uses, refused, history)


def run_bash(agent, call: ToolCall, command: str, timeout: int = BASH_TIMEOUT) -> str:
    return run_command(command, cwd=agent.workdir, timeout=max(1, min(timeout, 600)),
                       sandbox=agent.sandbox, secrets=agent.secrets, call_id=call.id or "bash")


def run_read_file(agent, call: ToolCall, path: str, offset: int = 1,
                  limit: int = READ_DEFAULT_LINES) -> str:
    target = workspace_path(agent.workdir, path)
    if not target.is_file():
        raise ToolError(f"{path} not found (or not a file). Call glob to list files.")
    offset, limit = max(offset, 1), max(limit, 1)
    # the same bytes already in the conversation are not sent twice: a stub points at them
    stub = agent.state.repeat_reads.stub(call.history, call.id, target, path, offset, limit)
    return stub or read_lines(target, path, offset, limit, agent.secrets)


def run_write_file(agent, call: ToolCall, path: str, content: str) -> str:
    return write_file(workspace_path(agent.workdir, path), path, content, agent.secrets)


def run_edit_file(agent, call: ToolCall, path: str, old_text: str, new_text: str) -> str:
    return edit_file(workspace_path(agent.workdir, path), path, old_text, new_text, agent.secrets)


def run_glob(agent, call: ToolCall, pattern: str, path: str = ".") -> str:
    return glob_files(agent.workdir, workspace_path(agent.workdir, path), pattern, path)


def run_todo_write(agent, call: ToolCall, items: list) -> str:
    problem = todo_problem(TODO_ITEM_SCHEMA, items)
    if problem:
        raise ToolError(problem)
    agent.state.todos = [{"content": i["content"], "status": i["status"]} for i in items]
    return render_todos(agent.state.todos)


def run_task(agent, call: ToolCall, prompt: str, description: str = "") -> str:
    """A subagent does the job in a fresh context. No session log records it: its work, every
    call and result, is saved as a transcript however it ends (large outputs as the main
    agent's)."""
    child = agent.subagent()
    work = [{"role": "user", "content": [{"type": "text", "text": redact(prompt, agent.secrets)}]}]
    agent.say(f"[task] subagent started: {description or prompt[:60]}")
    try:
        final = agent_loop(child, work) or "(the subagent stopped without a final answer)"
    finally:
        where = child.store.where_saved(work, "task")
    agent.say(f"[task] subagent finished; its calls and results are {where}")
    return f"{final}\n\n[the subagent's calls and results are {where}]"


def run_load_skill(agent, call: ToolCall, name: str) -> str:
    skill = agent.skills.get(name)
    if skill is None:
        available = ", ".join(agent.skills) or "none"
        raise ToolError(f"no skill named {name!r}. Available: {available}.")
    if name not in agent.state.loaded_skills:
        agent.state.loaded_skills.append(name)
    return f"<skill name=\"{name}\">\n{skill['body']}\n</skill>"


def run_compact(agent, call: ToolCall, focus: str = "") -> str:
    # The summary runs after the batch, as the tutorial's does: take_reply reads this field when
    # every call of the batch is answered (a summary now would cut the batch's pairs apart).
    agent.state.pending_compact = focus or ""
    return ("Compaction will run after this batch of tool calls; the conversation continues "
            "from the summary.")


# Each tool declared once: what the model is told, its handler, and what it does, which
# /undo, the ledger, the permission check, the sandbox and the work line read (basics/tools.py).
TOOLS = {tool.name: tool for tool in [
    Tool("bash", "Run a shell command in the workspace. Output is capped; redirect large output "
         "to a file and read parts of it.", schema(("command",), command=TEXT, timeout=TIMEOUT),
         run_bash, main_argument="command", runs="command"),
    Tool("read_file", "Read a text file, with line numbers. offset is the first line "
         f"(1-based), limit the number of lines (default {READ_DEFAULT_LINES}).",
         schema(("path",), path=TEXT, offset=NUMBER, limit=NUMBER),
         run_read_file, main_argument="path", reads="path"),
    Tool("write_file", "Create or overwrite a file with the given content.",
         schema(("path", "content"), path=TEXT, content=TEXT),
         run_write_file, main_argument="path", writes="path"),
    Tool("edit_file", "Replace old_text with new_text in a file. old_text must occur exactly "
         "once.", schema(("path", "old_text", "new_text"), path=TEXT, old_text=TEXT,
                         new_text=TEXT),
         run_edit_file, main_argument="path", writes="path"),
    Tool("glob", "List files matching a pattern such as '**/*.py', relative to the workspace "
         "(or to path inside it).", schema(("pattern",), pattern=TEXT, path=TEXT),
         run_glob, main_argument="pattern", lists="path"),
    Tool("todo_write", "Replace the todo list. Each item has content and a status: pending, "
         "in_progress or completed; at most one item is in_progress.",
         schema(("items",), items={"type": "array", "items": TODO_ITEM_SCHEMA}), run_todo_write),
    Tool("task", "Hand a self-contained job to a subagent with a fresh context. It has the "
         "same tools except task, and returns its final answer.",
         schema(("prompt",), prompt=WORDS, description=TEXT),
         run_task, main_argument="description", subagent=True),
    Tool("load_skill", "Load the full instructions of a skill listed in the system prompt.",
         schema(("name",), name=TEXT), run_load_skill, main_argument="name"),
    Tool("compact", "Summarize the conversation so far to free context. Runs after the current "
         "tool calls; focus says what the summary must keep.", schema((), focus=TEXT),
         run_compact, main_argument="focus"),
]}


# ---- hooks and the permission check --------------------------------------------------------------
# fire_hooks runs them; the others are the ones every session installs.

def fire_hooks(agent, event: str, **payload) -> list:
    """Run every hook for an event; return what they returned (None dropped). The summary asks
    PreCompact, RestoreContext and PostCompact hooks."""
    answers = [hook(payload) for hook in agent.hooks.get(event, [])]
    return [answer for answer in answers if answer is not None]


def check_permission(tool: Tool, args: dict, workdir: Path, sandboxed: bool = False) -> tuple:
    """Decide "allow", "deny" or "ask" for one tool call, with the reason, from what the tool's
    declaration says it does. A command is read by safety/command_risks.py: what deletes,
    overwrites or reaches outside the workspace asks, unless the sandbox refuses it anyway."""
    if tool.runs:
        command = str(args.get(tool.runs, ""))
        deny, ask = command_risks(command, workdir, sandboxed)
        if deny or ask:
            shown = one_line(command, 2000)  # whole, to judge
            return "deny" if deny else "ask", f"`{shown}` {'; '.join(deny or ask)}"
    if tool.path_argument:  # outside the workspace, the program's own folders and code
        path = str(args.get(tool.path_argument, "."))
        return path_risk(workdir, path, writes=bool(tool.writes))
    return "allow", ""


def permission_hook(agent):
    """The PreToolUse hook that asks check_permission and, for "ask", the person."""
    def hook(event: dict):
        decision, reason = check_permission(event["tool"], event["input"], agent.workdir,
                                            agent.sandbox.on)
        if decision == "allow":
            return None
        if decision == "ask":
            allowed, why = agent.confirm(f"{event['name']}: {reason}. Allow?")
            if allowed:
                return None
            reason = f"{reason} and {why}"
        return {"deny": f"Permission denied: {reason}. Ask the user, or find a safer way."}
    return hook


# ---- one user turn -------------------------------------------------------------------------------
# What command_line/user_turns.py's take_line hands a prompt to (what a turn needs around it).

def take_turn(agent, messages: list, prompt: str) -> bool:
    """One user turn: the hooks see the prompt, it joins the history, the loop runs, the Stop
    hooks see its end, however it came. False when an API error ended it."""
    prompt = redact(prompt, agent.secrets)  # before any hook: the ledger quotes prompts verbatim
    answers = fire_hooks(agent, "UserPromptSubmit", prompt=prompt)
    blocked = [answer["block"] for answer in answers if "block" in answer]
    if blocked:
        agent.say(f"(prompt blocked by a hook: {blocked[0]})")
        return True
    asked = add_prompt(agent, messages, prompt, estimate_text_tokens(prompt))
    if asked is None:
        return True
    final = None  # the model's last words, if it stopped on its own
    try:
        final = agent_loop(agent, messages)
    except (ContextOverflow, *api_failures()) as err:
        turn_failed(agent, messages, asked, err)
        return False
    finally:  # an answer, an API error, Ctrl-C, the step limit: undo records what the turn left
        fire_hooks(agent, "Stop", messages=messages, final=final)
    say_status(agent, messages, context_tokens(agent, messages))
    return True


# What a line typed at the prompt reaches: command_line/user_turns.py's take_line runs a
# prompt as a turn, and the REPL's commands (/compact summarizes now, /clear starts anew).
LESSON = Lesson(take_turn=take_turn, compact=compact_now, context_tokens=context_tokens)


# ==== PART 3: MAIN ================================================================================

def main(argv=None) -> int:
    """command_line/ reads the configuration, builds the agent, and starts the REPL with it."""
    config = configure(argv)  # or the exit code, once --list or a mistake has been dealt with
    if isinstance(config, int):
        return config
    if config.demo:
        from s08_context_compact.offline import demo  # a scripted model drives this very module
        return demo.run(sys.modules[__name__], pause=config.pause)
    return start_session(config, TOOLS, permission_hook, LESSON)


if __name__ == "__main__":
    sys.exit(run(main))
