"""Summaries written ahead: the summary compact_history will need, asked for in the background
at an early mark, so the loop rarely waits for one at the threshold.

Machinery the chapter does not need, made once for an agent from values: the function that
asks the model (`ask`, endpoint's send_request) and the agent's Connection. The loop uses a few
verbs and never meets the thread, the lock or the cancellation:

    ahead.due(messages, tokens, settings)    whether to summarize the history now
    ahead.start(messages, request, sent_tokens, about)
                                             ask(request) on a thread of its own, over a
                                             connection of its own that can be cut
    ahead.take(messages, settings, ...)      a Ready: the answer, the snapshot it answers,
                                             and the messages after it; or None
    ahead.drop(why)                          call it off (/clear, a focus, a second Ctrl-C)
    ahead.may_be_late(settings)              whether the summary in flight may come too late

The worker sends one request, already built, and hands back what came of it (Asked: the
reply, which carries what it cost, or the error). It never touches the history: its request
was built from a snapshot, a list of the history's plain dicts that no one changes. Turning
the reply into a summary, retrying, counting a failure and paying for the call are the
loop's, on its own thread. What a summary set aside cost waits in
`unpaid` for the loop to add it up. Leaving the program cancels every worker still running
(call_off_all, at exit).
"""

import atexit
import json
import math
import socket
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

from ..basics import Screen, Spinner, say_on
from ..endpoint import (Answer, api_error_text, api_failures, Connection, ContextOverflow,
                        failed_as_summary_error, own_connection)
from ..messages import OWN, blocks_of, is_request_block, snips_pending

RECENT_PASSES = 16       # the steps the lead is measured on
RECENT_SUMMARIES = 4     # the lead is their upper median: one slow summary moves no mark after it
SHARES = (0.5, 0.5, 0.75)  # upper medians: a summary's seconds, a step's; a big step's tokens
JOIN_SECONDS = 5.0       # a worker called off ends within this (its connection is cut at once)
WAIT_POLL_SECONDS = 0.2  # how often a wait for a summary in flight looks up (Ctrl-C stays prompt)
LABEL = "writing the summary ahead"


class Cancelled(BaseException):
    """The summary was called off. A BaseException, so no handler of API errors keeps it."""


@dataclass(frozen=True)
class Asked:
    """What the worker's request came to: the reply (with what it cost), or why there is none."""
    answer: Answer | None = None
    error: BaseException | None = None

    def reply(self) -> Answer:
        """The reply, or what stopped it raised again, on the loop's thread (a call that
        failed as SummaryError, as summary_reply raises it)."""
        if self.error is not None:
            with failed_as_summary_error():
                raise self.error
        return self.answer


@dataclass(frozen=True)
class Ready:
    """A summary asked for ahead, to be swapped in: what its request asked, what came of it,
    and what stays after the part it covers."""
    asked: Asked
    snapshot: list          # the messages its request summarized
    about: tuple            # what the loop said it was for when it started (its focus, its limit)
    suffix: list            # the history after the snapshot, kept verbatim
    notes: tuple = ()       # what a snip cut after the snapshot: its note, the request it put back
    room: int | None = None  # tokens the suffix may take for the next summary to be ready in time
    pending: tuple = ()      # transcripts of what that snip cut, for the next summary to read back

    @property
    def focus(self) -> str:
        return self.about[0]

    @property
    def limit(self) -> int:
        return self.about[1]


@dataclass(eq=False)  # a job is itself, not its fields
class Job:
    """One summary in the background: its snapshot, its thread, and what came of it."""
    snapshot: list                     # the messages summarized; the suffix starts after the last
    tokens: int                        # the context's size when it started
    # Messages snipped before its snapshot (the newest note's count).
    snipped: int
    about: tuple
    started: float
    thread: threading.Thread = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    sockets: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    heard: list = field(default_factory=list)   # what the worker said, said by the loop later
    interrupted: bool = False          # Ctrl-C stopped a wait for it once; it went on
    asked: Asked | None = None         # None while it runs, and when it was called off
    seconds: float = 0.0

    @property
    def covered(self) -> int:
        return len(self.snapshot)

    def on_request(self, request) -> None:
        """Every request the worker sends: a trace hook hands back the connection it opens."""
        if self.cancelled.is_set():
            raise Cancelled
        request.extensions = {**request.extensions, "trace": self.trace}

    def trace(self, event: str, info: dict) -> None:
        # TLS wraps the connected socket in a new one: the TLS one is what a read blocks on
        opened = (".connect_tcp.complete", ".connect_unix_socket.complete", ".start_tls.complete")
        if event.endswith(opened):
            sock = info["return_value"].get_extra_info("socket")
            with self.lock:
                self.sockets.append(sock)
            if self.cancelled.is_set():
                cut(sock)

    def say(self, text: str, *_) -> None:
        if self.cancelled.is_set():
            raise Cancelled  # said before a retry's pause: a worker called off does not pause
        self.heard.append(text)

    def cancel(self) -> None:
        self.cancelled.set()
        with self.lock:
            for sock in self.sockets:
                cut(sock)  # a read blocked on it returns at once
        if self.thread and self.thread is not threading.current_thread():
            self.thread.join(JOIN_SECONDS)


def cut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


RUNNING = weakref.WeakSet()


@atexit.register
def call_off_all() -> None:
    """Leaving: no worker outlives the program, and no request is left hanging."""
    for job in list(RUNNING):
        job.cancel()


def ask_in_background(job: Job, ask: Callable, connection: Connection, request: dict,
                      sent_tokens: int, label: str, name: str) -> None:
    """ask(request) on a thread of its own (named `name`), over a connection of its own that
    job.cancel cuts:
    job.asked holds what came of it (or, for a fault, job.heard says what), and job.done is
    set when it is over. What it would say goes to job.heard, said by the loop later."""
    screen = Screen(job.say, secrets=connection.screen.secrets)  # nothing on screen now

    def work():
        close = None
        try:
            own, close = own_connection(replace(connection, screen=screen), job.on_request)
            job.asked = Asked(ask(own, request, sent_tokens, label=label))
        except Cancelled:
            pass
        except (ContextOverflow, *api_failures()) as err:  # the loop decides what it means
            job.asked = Asked(error=err)
        except Exception as err:  # a fault in the worker must not pass in silence
            job.heard.append(f"[{name.replace('-', ' ')}] failed: {type(err).__name__}: {err}")
        finally:
            job.seconds = time.monotonic() - job.started
            if close:
                close()
            job.done.set()

    job.thread = threading.Thread(target=work, name=name, daemon=True)
    RUNNING.add(job)
    job.thread.start()  # before anything Ctrl-C could interrupt: a job set is a job running


class SummaryAhead:
    """At most one summary in the background, and what the session measured of them. Off
    (`ask` None) for a loop that compacts as before: a subagent, a session without a client."""

    def __init__(self, ask: Callable | None = None, connection: Connection | None = None):
        self.ask, self.connection = ask, connection
        self.screen = connection.screen if connection else Screen()
        self.job = None
        self.passes = deque(maxlen=RECENT_PASSES)   # (time, context tokens, within a turn) a pass
        self.durations = deque(maxlen=RECENT_SUMMARIES)  # seconds the recent summaries took
        self.made = self.used = self.discarded = 0
        self.waits = []                             # seconds the loop waited, per summary used
        self.discarded_usage = {}                   # what the summaries set aside were billed
        self.unpaid = []                            # (reply, label) of those, to be added up

    def say(self, text: str, style: str = "") -> None:
        say_on(self.screen, text, style)

    # ---- when to start ---------------------------------------------------------------------------

    def lead(self) -> int | None:
        """Tokens the steps add while a summary is written, at the pace measured (seconds a
        summary takes, seconds and tokens a step takes), or None before that is measured."""
        steps = list(self.passes)
        # A step is the time from one pass to the next within a turn; before a prompt the
        # user's pause counts too, so such gaps count only in a session of prompts alone.
        gaps = [b[0] - a[0] for a, b in zip(steps, steps[1:]) if b[2]] or \
            [b[0] - a[0] for a, b in zip(steps, steps[1:])]
        growth = [b[1] - a[1] for a, b in zip(steps, steps[1:]) if b[1] > a[1]]
        if not self.durations or not gaps or not growth:
            return None
        summary_seconds = min_share(self.durations, SHARES[0])
        step_seconds = max(min_share(gaps, SHARES[1]), 1e-3)
        # In whole steps, rounded up: each step more keeps a step more verbatim after the swap,
        # and so costs; a summary slower than usual makes the loop wait only what is left of it.
        return math.ceil(summary_seconds / step_seconds) * min_share(growth, SHARES[2])

    def placed(self, threshold: int, shares: tuple) -> tuple:
        """(tokens at which a summary starts, why there): at the last pass that still leaves it
        its lead before the threshold, kept under the latest share. Where the lead is longer
        than the room above the earliest share it starts below it, down to right after the
        previous compaction (0: the first pass that can start one). A range of one share pins it."""
        earliest, latest = int(threshold * shares[0]), int(threshold * shares[1])
        lead = self.lead()
        if earliest == latest:
            return earliest, "the share of the threshold SUMMARY_AHEAD pins it at"
        if lead is None:
            return earliest, "the earliest share of the threshold: no summary has been timed yet"
        if threshold - lead >= latest:
            return latest, "the latest share of the threshold: a summary takes few steps"
        if threshold - lead > 0:
            return threshold - lead, (f"the threshold less the {lead:,} tokens "
                                      "the steps add while a summary is written")
        return 0, (f"right after a compaction: the steps add {lead:,} tokens "
                   "while a summary is written, more than the threshold holds")

    def mark(self, threshold: int, shares: tuple) -> int:
        """Tokens at which a summary starts (placed)."""
        return self.placed(threshold, shares)[0]

    def log_mark(self, settings) -> int | None:
        """The early mark as the session log records it with each call: None when off."""
        if not settings.summary_ahead:
            return None
        return self.mark(settings.threshold, settings.summary_ahead)

    def room_to_keep(self, s, overhead: int, summary_chars: int) -> int | None:
        """Tokens the part kept after a swap may take for the next summary to be ready in time:
        the threshold less its lead, the system prompt and tools, the summary (four characters a
        token) and what comes back after it (a fortieth of the window); None before one is timed.
        A pinned mark pins the lead too (the room from the mark to the threshold), so each run
        of the tests and the demo keeps the same part, however fast its steps came."""
        shares = s.summary_ahead
        if shares and shares[0] == shares[1]:
            lead = s.threshold - int(s.threshold * shares[0])
        else:
            lead = self.lead()
        if lead is None:
            return None
        return max(s.threshold - lead, 0) - overhead - summary_chars // 4 - s.window // 40

    def due(self, messages: list, tokens: int, settings) -> bool:
        """After a pipeline pass (and its compaction, if any): whether to summarize the history
        now. The snapshot is the whole history as the next request will send it, which ends
        with the user's words or a complete call and its results: a summary can cover nothing
        newer. Its request and that next one share their prefix, so one writes the cache the
        other reads."""
        last = blocks_of(messages[-1]) if messages else []
        within_a_turn = any(b.get("type") == "tool_result" for b in last)
        self.passes.append((time.monotonic(), tokens, within_a_turn))
        shares = settings.summary_ahead
        if self.job and self.job.done.is_set() and self.job.heard:  # its retries, said now
            for line in self.job.heard:
                self.say(line, "dim")
            self.job.heard = []
        if self.job or not shares or not self.ask:
            return False  # one at a time; off; a subagent compacts as before
        if tokens < self.mark(settings.threshold, shares):
            return False
        return len(messages) > 2 and messages[-1]["role"] == "user"

    def reading(self) -> set:
        """The transcripts of what snip cut that the summary in flight (or ready) read back:
        those its snapshot's notes list (with_snipped)."""
        return set(snips_pending(self.job.snapshot)) if self.job else set()

    def may_be_late(self, settings) -> bool:
        """Whether the summary still being written may come too late: it takes longer than the
        steps take to fill the room above the earliest share (the mark was placed below it for
        that), or none has been timed yet. Never with a pinned mark: the tests and the demo pin
        it so each run goes the same way."""
        shares, threshold = settings.summary_ahead, settings.threshold
        if self.job is None or self.job.done.is_set() or not shares or shares[0] == shares[1]:
            return False
        return self.lead() is None or self.placed(threshold, shares)[0] < int(threshold * shares[0])

    # ---- the worker --------------------------------------------------------------------------

    def start(self, messages: list, request: dict, sent_tokens: int, about: tuple = ()) -> None:
        """ask(request) in a thread, over a connection of its own; `request` summarizes the
        messages, the snapshot: a new list of the same dicts, which no one changes. `about`
        comes back with the answer (Ready.about)."""
        snapshot = list(messages)
        tokens = self.passes[-1][1] if self.passes else 0
        job = Job(snapshot, tokens, snip_count(snapshot), about, time.monotonic())
        ask_in_background(job, self.ask, self.connection, request, sent_tokens, LABEL,
                          "summary-ahead")
        self.job, self.made = job, self.made + 1
        self.say(f"[summary ahead] writing a summary of {len(snapshot)} messages in the "
                 f"background ({job.tokens:,} tokens in context); the work goes on", "layer")

    # ---- at the threshold --------------------------------------------------------------------

    def take(self, messages: list, settings, overhead: int, measure, focus: str = "",
             max_suffix: int | None = None) -> Ready | None:
        """The summary asked for ahead, to replace the history up to its snapshot; the
        messages after that are handed back to be kept. Waits for one still in flight (it
        started earlier than a new one would, and what it leaves is shortened without a call).
        None when there is none, or it cannot be used (said, and set aside): the history
        changed where its snapshot ended, or, given max_suffix (reactive_compact's tail),
        more came after it than measure(suffix) allows."""
        job = self.job
        if job is None:
            return None
        if focus:
            self.drop("a summary with a focus was asked for")
            return None
        start, snip_note, put_back = self.suffix_start(job, messages)
        if start is None or messages[start:start + 1] and messages[start]["role"] != "assistant":
            self.drop("the history where its snapshot ended changed")
            return None
        suffix = messages[start:]
        if max_suffix is not None and measure(suffix) > max_suffix:
            self.drop("more came after its snapshot than the tail that may stay")
            return None
        waited = self.wait(job)
        if job.asked is None:  # a fault, said: the summary is made at the threshold
            self.drop("it failed; the summary is written now")
            return None
        self.job = None
        self.settle(job)
        self.used += 1
        self.waits.append(waited)
        kept = (f"the {len(suffix)} after them are kept verbatim" if suffix
                else "nothing came after them")
        if job.asked.error is not None:  # counted as a failed summary where it is taken
            self.say(f"[summary ahead] it failed ({api_error_text(job.asked.error)}) after "
                     f"{job.seconds:.1f}s; the work waited {waited:.1f}s", "dim")
        else:
            self.say(f"[summary ahead] swapped in: it covers the first {start} messages "
                     f"(written in {job.seconds:.1f}s); {kept}; the work waited {waited:.1f}s",
                     "layer")
        notes, pending = (), ()
        if snip_note:  # what the snip cut after the snapshot: where it went, what it did
            # and the request it put back, unless that is still the request being worked on,
            # which comes back last anyway
            newer = any(is_request_block(b) for m in suffix if m["role"] == "user"
                        for b in blocks_of(m))
            carried = put_back if newer or messages[-1]["role"] == "assistant" else []
            notes = (snip_note["text"], *carried)
            # the parts it cut that the snapshot's summary did not read back: the next one will
            known = {p for m in job.snapshot for b in blocks_of(m) if b.get(OWN) == "snip"
                     for p in b.get("pending", [])}
            pending = tuple(p for p in snip_note.get("pending", []) if p not in known)
        said = job.asked.answer.message["content"] if job.asked.answer else []
        chars = sum(len(b.get("text", "")) for b in said) + sum(map(len, notes))
        room = self.room_to_keep(settings, overhead, chars)
        return Ready(job.asked, job.snapshot, job.about, suffix, notes, room, pending)

    def suffix_start(self, job: Job, messages: list) -> tuple:
        """(where the messages after the snapshot begin, or None; the note of a snip that cut
        past the snapshot, and the request it put back, if one did)."""
        # The snapshot's last message: the very message, as layers copy only what they change;
        # or, copied, where it was less what snips removed (layers never add or move a message;
        # a snip removes some, and its note counts them), holding no block it did not hold.
        last, removed = job.snapshot[-1], snip_count(messages) - job.snipped
        end = next((i for i, m in enumerate(messages) if m is last), None)  # no layer copied it
        where = job.covered - removed - 1
        if end is None and 0 <= where < len(messages) and same_message(messages[where], last):
            end = where  # copied (a result cleared), where it should be
        if end is not None:
            return end + 1, None, None
        if removed > 0:  # a snip took that message: what it kept after its note is all newer
            return newer_snip(messages, job.snipped)
        return None, None, None

    def wait(self, job: Job) -> float:
        """Seconds spent waiting for the job to finish. Ctrl-C stops the wait and leaves the job
        writing, to be swapped in at the threshold once ready; Ctrl-C in a later wait for the
        same job calls it off (as /clear does). Either way the turn ends as interrupted."""
        if job.done.is_set():
            return 0.0
        began = time.monotonic()
        try:
            stop = "Ctrl-C again calls it off" if job.interrupted else "Ctrl-C stops waiting"
            self.say(f"[summary ahead] waiting for the summary being written in the background "
                     f"({stop})", "dim")
            with Spinner(self.screen.spinner_to, "finishing the summary started in the background"):
                while not job.done.wait(WAIT_POLL_SECONDS) and job.thread.is_alive():
                    pass
        except KeyboardInterrupt:
            if job.interrupted:  # the second time: the person does not want to wait for this one
                self.drop("Ctrl-C again while waiting for it")
            else:
                job.interrupted = True
                self.say("[summary ahead] it goes on in the background, to be swapped in when "
                         "ready (Ctrl-C while waiting for it again calls it off)", "dim")
            raise
        return time.monotonic() - began

    def settle(self, job: Job) -> None:
        """On the loop's thread, once a job is over: what it said, and how long it took."""
        RUNNING.discard(job)
        for line in job.heard:
            self.say(line, "dim")
        if job.asked and job.asked.answer and not job.cancelled.is_set():
            self.durations.append(job.seconds)

    def drop(self, why: str) -> None:
        """Call off the summary in flight, or set aside the one ready: it never reaches the
        history. What it cost waits in `unpaid`, with why, for the loop to add up."""
        job, self.job = self.job, None
        if job is None:
            return
        finished = job.done.is_set()
        job.cancel()
        job.heard = [line for line in job.heard if not line.startswith("[api]")]  # moot now
        self.settle(job)
        what = "set aside" if finished else "called off"
        answer = job.asked.answer if job.asked else None
        if answer is not None:
            self.unpaid.append((answer, f"{LABEL} ({what}: {why})"))
            for kind, value in answer.usage.items():
                self.discarded_usage[kind] = self.discarded_usage.get(kind, 0) + value
        self.discarded += 1
        self.say(f"[summary ahead] {what}: {why}", "dim")

    def bills(self) -> list:
        """What summaries set aside cost, each (reply, label), handed over once."""
        unpaid, self.unpaid = self.unpaid, []
        return unpaid

    # ---- what /context shows -----------------------------------------------------------------

    def describe(self, settings) -> str:
        shares = settings.summary_ahead
        if not shares:
            return "summary ahead: off (SUMMARY_AHEAD=off); summaries are written at the threshold"
        job = self.job
        if job is None:
            mark, why = self.placed(settings.threshold, shares)
            state = f"none in flight; the next starts at {mark:,} tokens: {why}"
        elif job.asked is not None and job.asked.error is not None:
            state = (f"the one of the first {job.covered} messages failed "
                     f"({api_error_text(job.asked.error)}); at the threshold it counts as a "
                     "failed summary")
        elif job.done.is_set():
            state = (f"one ready (of the first {job.covered} messages), to be swapped in at the "
                     "threshold")
        else:
            state = (f"one being written, of the first {job.covered} messages, for "
                     f"{time.monotonic() - job.started:.0f}s")
        waited = f"; waited {sum(self.waits):.1f}s in all" if self.used else ""
        return (f"summary ahead: {state} ({self.made} made, {self.used} used, {self.discarded} "
                f"called off or set aside{waited})")


def snip_count(messages: list) -> int:
    """How many messages the snips so far have cut (each snip note carries the running count)."""
    counts = (b.get("snipped", 0) for m in messages for b in blocks_of(m) if b.get(OWN) == "snip")
    return max(counts, default=0)


def newer_snip(messages: list, snipped: int) -> tuple:
    """(where the messages a snip newer than the snapshot kept begin, its note block, the request
    it put back after the note), or (None, None, None).

    A snip cuts one run of messages and leaves its note in the message before the run, and
    after it the current request if the run held that. If the run held the snapshot's last
    message, everything after the run came after the snapshot too, and the note says where
    the rest of the run went."""
    for i in range(len(messages) - 1, -1, -1):
        blocks = blocks_of(messages[i])
        notes = [k for k, b in enumerate(blocks)
                 if b.get(OWN) == "snip" and b.get("snipped", 0) > snipped]
        if notes and i + 1 < len(messages) and messages[i + 1]["role"] == "assistant":
            put_back = [b["text"] for b in blocks[notes[-1] + 1:] if is_request_block(b)]
            return i + 1, blocks[notes[-1]], put_back
    return None, None, None


def min_share(values: list, share: float) -> float:
    """The value at `share` of the way up the sorted values (0.25: a low one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def same_message(current: dict, then: dict) -> bool:
    """A copy of `then` that a layer only shortened: the same role and the same blocks, of
    which only a result's body (cleared) may differ. Words merged into it since (after a
    failed turn), or put in place of others, make it another message; a summary of what snip
    cut, joined at its end since, does not."""
    def shape(message):
        return [(b.get("type"), b.get("tool_use_id") or b.get("id"),
                 None if b.get("type") == "tool_result" else json.dumps(b, sort_keys=True))
                for b in blocks_of(message) if b.get(OWN) != "snip_summary"]
    return current["role"] == then["role"] and shape(current) == shape(then)
