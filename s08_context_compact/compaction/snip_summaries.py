"""What snip cut, summarized later. A snip is cheap when it cuts: no call, its part saved to a
transcript first. Then that transcript is summarized in the background, in a request of its
own (the part written out, with the summary of the part before it), and the summary joins
the end of the context when it is ready: a text block after the last user message's other
blocks, so every message before it, and the prompt cache that holds them, stays as it was.
Until then the snip's note says where the part went, and a summary of the whole history
reads the transcript back (messages/history.py's snipped_back). Near snip's trigger, the
part the next snip will cut is summarized ahead, from the history: the snip then cuts that
part and no more, and its summary joins as the snip's own, so nothing leaves view.
Forgetting costs more than the summary: an agent that no longer sees what it did reads the
same files again, or undoes its own work.

Machinery the chapter does not need, made once for an agent from values: the function that
asks the model (`ask`, endpoint's send_request), the agent's Connection and Store, and the
summary written ahead (SummaryAhead: what the one in flight reads back). The loop calls:

    snips.keep_tail(messages, keep_tail)   what snip keeps after its cut (the pipeline): with a
                                           part summarized ahead, all after that part
    snips.joined(messages)                 the history with a summary that is ready joined at
                                           its end (the pipeline, before the summary layers)
    snips.summarize(messages, settings, tokens)
                                           when a part waits that no summary being written
                                           reads, its summary started (after the summary ahead
                                           had its turn: one that started reads the parts);
                                           with none waiting, near snip's trigger, the summary
                                           of the part the next snip will cut (written ahead)
    snips.bills()                          what the summaries cost, handed over once
    snips.describe(messages)               what /context shows

The worker is summary_ahead.py's: one request on a thread of its own, cut when called off.
"""

import time
from dataclasses import replace
from typing import Callable

from ..basics import Screen, say_on
from ..endpoint import Connection, api_error_text
from ..messages import (NOTE_MARKER, OWN, blocks_of, covered_by, estimate_text_tokens,
                        estimate_tokens, own_text, snip_bounds, snips_covered, snips_pending,
                        waiting_parts, with_calls_grouped, with_text, written_text)
from .summary import reply_problem
from .summary_ahead import RUNNING, Job, ask_in_background
from .summary_writer import ESTIMATE_MARGIN

SUMMARY_SHARE = 0.01     # a part's summary: at most this share of the window,
MIN_SUMMARY_TOKENS = 200  # and at least this, however small the window;
PART_SHARE = 4           # and at most a quarter of the part it stands for
HEADS = (300, 150, 60)   # characters of each long text written out: fewer when the part is big
LABEL = "summarizing what snip cut"
AHEAD_SHARE = 0.85       # past this share of snip's trigger, what it will cut is summarized
UNCUT = ""               # the transcript of a part summarized ahead, until the snip saves it
WAIT_SECONDS = 60.0      # the longest a pass waits for one, where settings say it waits
INSTRUCTIONS = """\
TEXT ONLY, NO TOOLS. Do not call any tool in this answer: this turn only writes a summary.

The messages above were cut from the middle of a coding session to save room, and written
out: each call with its id, tool and input, each result's head. The work goes on without
them, from your summary, which also stands for the summaries of earlier parts above, if
any: take in what they say. Write inside <summary></summary> what was done, in order: what
the user asked, the files read, changed or created and what was found in them (names,
functions, facts), the commands run and how they ended, errors met and how they were fixed,
decisions taken, and what was left open. Keep the <summary> under {limit:,} tokens (about
{words:,} words); leave out nothing the work still needs and nothing vague."""


class SnipSummaries:
    """At most one part's summary in the background. Off (`ask` None) for a loop whose snips
    wait for its next summary: a subagent, a session without a client."""

    def __init__(self, ask: Callable | None = None, connection: Connection | None = None,
                 store=None, ahead=None):
        self.ask, self.connection, self.store, self.ahead = ask, connection, store, ahead
        self.screen = connection.screen if connection else Screen()
        self.job = None
        self.done = set()     # transcripts summarized, or whose summary failed: not asked again
        self.before = set()   # the transcripts listed when the part summarized ahead was asked for
        self.listed = set()   # the transcripts listed as the last pass ended
        self.unpaid = []      # (reply, label) of each summary, for the loop to add up

    def say(self, text: str, style: str = "") -> None:
        say_on(self.screen, text, style)

    def summarize(self, messages: list, settings, tokens: int) -> None:
        """If none is being written, start the summary of a part that waits; with none waiting,
        past AHEAD_SHARE of snip's trigger (`tokens`: the context's size), the summary of the
        part the next snip will cut, so that it is ready when the snip cuts it."""
        self.listed = set(snips_pending(messages))  # as the pass ends: the next may snip
        if not self.ask or self.job is not None:
            return
        if self.waiting(messages):
            self.start(messages, settings)
        elif tokens > settings.micro_trigger * AHEAD_SHARE:
            self.start_ahead(messages, settings)
        if settings.snip_summary_waits and self.job:  # written now
            self.job.done.wait(WAIT_SECONDS)

    def waiting(self, messages: list) -> list:
        """The transcripts no summary covers or is being written from (this one's, or the
        summary ahead's, which read them back): read only when there are some, so a pass with
        nothing new reads no file."""
        skip = self.done | snips_covered(messages) | self.read_ahead()
        return [p for p in snips_pending(messages) if p not in skip]

    def read_ahead(self) -> set:
        return self.ahead.reading() if self.ahead else set()

    def start(self, messages: list, settings) -> None:
        """Write out the oldest parts that fit one request, and ask for their summary."""
        parts = waiting_parts(messages, self.store.read_back, skip=self.done | self.read_ahead())
        self.done |= set(self.waiting(messages)) - {path for path, _ in parts}  # unreadable
        if parts:
            self.ask_for(parts, messages, settings)

    def start_ahead(self, messages: list, settings) -> None:
        """Ask for the summary of what the next snip will cut in any case: the middle between
        snip's head and where its tail starts now (the tail only moves on). Only a part snip
        would cut, as its settings say: at least snip_at_least messages and snip_min_tokens."""
        s = settings
        bounds = snip_bounds(messages, s.snip_keep_head, s.snip_keep_tail, s.snip_at_least)
        if bounds is None:
            return
        part = messages[bounds[0]:bounds[1]]
        if len(part) >= s.snip_at_least and estimate_tokens(part) >= s.snip_min_tokens:
            self.before = set(snips_pending(messages))
            self.ask_for([(UNCUT, part)], messages, settings, part)

    def keep_tail(self, messages: list, keep_tail: int) -> int:
        """The messages snip keeps after its cut: while the part summarized ahead is where it
        was, those after it, so that the snip cuts that part and no more; else keep_tail."""
        job = self.job
        if job is None or not job.snapshot or job.about[0] != (UNCUT,):
            return keep_tail
        part = job.snapshot
        start = next((i for i, m in enumerate(messages) if m is part[0]), None)
        end = (start or 0) + len(part)
        if start is None or end >= len(messages) or \
                any(a is not b for a, b in zip(messages[start:end], part)):
            return keep_tail
        return len(messages) - end

    def ask_for(self, parts: list, messages: list, settings, snapshot: list = ()) -> None:
        """Write out the oldest of these parts (each (transcript, messages)) that fit one
        request, and ask for their summary in the background."""
        # the notes in view go into this summary, which then stands for them (still_needed)
        earlier = [b for m in messages for b in blocks_of(m) if b.get(OWN) == "snip_summary"]
        previous = "\n\n".join(b["text"] for b in earlier)
        undercount = self.connection.endpoint.undercount
        room = int((settings.window - settings.summary_max_tokens) / undercount * ESTIMATE_MARGIN)
        room -= estimate_text_tokens(previous) + estimate_text_tokens(INSTRUCTIONS) + 50
        paths, text = [], ""
        for path, part in parts:  # whole parts, oldest first, as many as fit
            written = fitted(part, room - estimate_text_tokens(text))
            if written is None:
                break
            paths, text = paths + [path], "\n".join(filter(None, [text, written]))
        # What the summary will stand for: these parts, the notes written out whole in them (a
        # later snip cut the message that held one), and the notes in view; a note that a snip
        # moved into the head is in both, and is sent once.
        in_parts = [b for path, part in parts if path in paths for m in part
                    for b in blocks_of(m) if b.get(OWN) == "snip_summary"]
        earlier = [b for b in earlier if b["text"] not in {n["text"] for n in in_parts}]
        previous = "\n\n".join(b["text"] for b in earlier)
        covers = paths + sorted(covered_by(in_parts + earlier))
        if not paths:  # the first alone does not fit, however short its heads: its start is
            paths, covers = [parts[0][0]], []  # summarized, and the whole read back later
            text = cut_to(written_text(parts[0][1], HEADS[-1]), room, parts[0][0])
        counted = sum(len(part) for path, part in parts if path in paths)
        limit = max(MIN_SUMMARY_TOKENS, min(int(settings.window * SUMMARY_SHARE),
                                            estimate_text_tokens(text) // PART_SHARE))
        content = ([{"type": "text", "text": "[The summaries of what snip cut before these "
                     f"messages:]\n{previous}"}] if previous else []) + [
            {"type": "text", "text": f"[{counted} messages snip cut, written out:]\n{text}"},
            {"type": "text", "text": INSTRUCTIONS.format(limit=limit, words=limit * 3 // 4)}]
        # room for a reply a half over the limit, which is still taken; no more is paid for
        request = {"model": settings.model, "messages": [{"role": "user", "content": content}],
                   "max_tokens": min(settings.summary_max_tokens, 2 * limit)}
        job = Job(list(snapshot), 0, 0, (tuple(paths), tuple(covers), counted, limit),
                  time.monotonic())
        # Not retried: a part whose summary fails waits for the history's, which reads it back;
        # retried, a hung endpoint would keep it out of view four times as long.
        ask_in_background(job, self.ask, replace(self.connection, retries=0), request,
                          sum(estimate_text_tokens(b["text"]) for b in content), LABEL,
                          "snip-summary")
        self.job = job
        what = "what snip will cut next" if snapshot else "what snip cut"
        self.say(f"[snip_compact] summarizing {what} ({counted} messages) in the background",
                 "dim")

    def joined(self, messages: list) -> list:
        """A finished summary, after the last user message's blocks (or set aside when what it
        covers is no longer waiting: a summary of the whole history read it back)."""
        messages = self.listing_kept(messages)
        job = self.job
        if job is not None and job.about[0] == (UNCUT,) and not self.cut(job, messages):
            return messages  # written ahead: waits for the snip that cuts its part
        job = self.job
        if job is None or not job.done.is_set() or not messages \
                or messages[-1]["role"] != "user":
            return messages
        self.job = None
        RUNNING.discard(job)
        for line in job.heard:  # a fault in the worker; what its call met is said below
            if not line.startswith("[api]"):
                self.say(line, "dim")
        paths, covers, counted, limit = job.about
        self.done |= set(paths)
        answer = job.asked.answer if job.asked else None
        summary = answer.summary if answer is not None else ""
        names = " ".join(path.rsplit("/", 1)[-1] for path in paths)
        problem = why_not(job.asked, limit)
        if problem:
            self.bill(answer, f"failed ({problem}), for {names}")
            self.say(f"[snip_compact] the summary of what it cut failed ({problem}); the next "
                     "summary of the history reads it back", "dim")
            return messages
        if not set(paths) & set(snips_pending(messages)):  # summarized with the history since
            self.bill(answer, "set aside: the history was summarized first")
            return messages
        self.bill(answer, f"joined, for {names}")  # the session's picture reads which
        whole = "" if covers else "the start of "
        block = own_text("snip_summary", f"{NOTE_MARKER}: {whole}what snip cut earlier ({counted} "
                         f"messages, saved in {', '.join(paths)}), summarized; not a new "
                         f"request]\n{summary}", covers=list(covers))
        self.say(f"[snip_compact] what it cut ({counted} messages) is summarized: "
                 f"{estimate_text_tokens(summary):,} tokens at the end of the context, written "
                 f"in {job.seconds:.1f}s", "layer")
        return messages[:-1] + [with_text(messages[-1], block)]

    def listing_kept(self, messages: list) -> list:
        """A snip of this pass lists each call it cut. Its note shrinks to what they did, free
        as the snip rewrote the head anyway, unless a summary written ahead is in flight: that
        summary stands for the part once swapped in, so the list keeps the calls in view until
        then. Otherwise the part's own summary comes within a few steps."""
        if self.ahead and self.ahead.job:
            return messages
        for path in set(snips_pending(messages)) - self.listed:
            messages = with_calls_grouped(messages, path)
        return messages

    def cut(self, job: Job, messages: list) -> bool:
        """Whether the part summarized ahead has been cut: its job then names the transcript
        the snip saved it in (one listed since the summary was asked for, which begins with
        that part, message for message). A part that went some other way (summarized
        with the history, or into no such transcript) sets the summary aside: what was cut
        waits for a summary of its own, as any cut does."""
        part = job.snapshot
        if any(m is part[0] for m in messages):
            return False
        expected = self.store.secrets.redact_json(part)  # as the store saved it
        for path in (p for p in snips_pending(messages) if p not in self.before):
            saved = self.store.read_back(path) or []
            if saved[:len(part)] == expected:
                paths, covers, counted, limit = job.about
                covers = () if len(saved) > len(part) else covers  # cut with more: the start
                covers = tuple(path if each == UNCUT else each for each in covers)
                job.about = ((path,), covers, counted, limit)
                return True
        self.end("set aside: what it summarized went another way")
        return False

    def drop(self) -> None:
        """Call off the summary being written (/clear): what it covers is moot."""
        if self.job is not None:
            self.end("called off")
            self.say("[snip_compact] the summary of what it cut: called off", "dim")

    def end(self, what: str) -> None:
        """The job over without being joined: called off if it runs, paid for if it finished."""
        job, self.job = self.job, None
        job.cancel()
        RUNNING.discard(job)
        if job.asked:
            self.bill(job.asked.answer, what)

    def bill(self, answer, what: str) -> None:
        """What a reply cost, with what came of it, for the loop to add up and log."""
        if answer is not None:
            self.unpaid.append((answer, f"{LABEL}: {what}"))

    def bills(self) -> list:
        """What the summaries cost, each (reply, label), handed over once."""
        unpaid, self.unpaid = self.unpaid, []
        return unpaid

    def describe(self, messages: list) -> str:
        """What /context shows: the parts waiting, the one being summarized, and the part
        the next snip will cut, if it is summarized ahead."""
        job, ahead = self.job, ""
        if job is not None and job.about[0] == (UNCUT,):  # what it writes is not cut yet
            state = "summarized" if job.done.is_set() else "being summarized in the background"
            job, ahead = None, (f"What the next snip will cut ({job.about[2]} messages): {state}, "
                                "to join when it is cut")
        waiting = len(set(snips_pending(messages)) - snips_covered(messages))
        if not waiting:
            return ahead
        if job is None:
            them = "them" if waiting > 1 else "it"
            being = f"; the next summary of the history reads {them} back"
        elif job.done.is_set():
            being = (f"; the summary of {len(job.about[0])} of them is ready, to join at the "
                     "next step")
        else:
            being = f"; {len(job.about[0])} of them being summarized in the background"
        said = (f"What snip cut, waiting to be summarized: {waiting} "
                f"transcript{'s' if waiting != 1 else ''}{being}")
        return "\n".join(filter(None, [said, ahead]))


def why_not(asked, limit: int) -> str:
    """Why a reply is no summary of what snip cut ("" when it is one)."""
    if asked is None:
        return "it failed"
    if asked.error is not None:
        return api_error_text(asked.error)
    return reply_problem(asked.answer, limit + limit // 2)  # a half over is still taken


def fitted(part: list, room: int) -> str | None:
    """A part written out in room tokens, its long texts cut to shorter heads if need be."""
    for head in HEADS:
        text = written_text(part, head)
        if estimate_text_tokens(text) <= room:
            return text
    return None


def cut_to(text: str, room: int, path: str) -> str:
    """The text's first lines that fit in room tokens, and where the rest is."""
    lines, size = [], 0
    for line in text.split("\n"):
        size += estimate_text_tokens(line) + 1
        if size > room - 40:
            break
        lines.append(line)
    where = f"in {path}" if path else "on disk"
    return "\n".join(lines + [f"[... the rest of this part is {where}, not written out here]"])
