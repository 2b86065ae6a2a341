"""Writing one summary: the model's, in a call or a few, else one built without it, so that
compaction succeeds in every case.

Machinery the chapter does not need to read: code.py's summary layers say what is summarized
and what replaces it, and hand the messages here. The SummaryWriter is made once for an agent
from values (its Connection, the system prompt and the tools a request carries) and keeps
the circuit breaker: after MAX_CONSECUTIVE_SUMMARY_FAILURES failed summaries in a row it asks
the model no more. What each call cost is kept for the loop to add up (bills), as the
summary written ahead's and snip_summaries.py's are.

A summary's request continues the conversation's, cache marks and all, with the instruction
added at the end: setting tool_choice would invalidate the prompt cache, so words alone
forbid tools. Messages too big for one request are summarized in pieces (summary.py's
fit_in_pieces); a request refused as too long teaches the endpoint its window and is sent
again with less, as the loop's would be.
"""

from dataclasses import dataclass

from ..basics import Screen, say_on
from ..endpoint import (Answer, Connection, ContextOverflow, count_tokens, marked_request,
                        summary_reply, SummaryError)
from ..messages import estimate_text_tokens, estimate_tokens
from .summary import (cleared_to_fit, fallback_summary, fit_in_pieces, reply_problem,
                      smaller_budget, summary_instructions)

SUMMARY_ATTEMPTS = 4                  # tries at one summary; after "too long", with less sent
MAX_CONSECUTIVE_SUMMARY_FAILURES = 3  # circuit breaker: stop paying for summaries that fail
ESTIMATE_MARGIN = 0.85                # a request sized by estimate: assume it may be 15% low
CLOSE_CALL = 0.1                      # this close to the window, the endpoint's count decides
LABEL = "writing the summary"


@dataclass
class Breaker:
    """Summaries failed in a row; at MAX_CONSECUTIVE_SUMMARY_FAILURES none is asked for."""
    failures: int = 0
    announced: bool = False  # its opening said


class SummaryWriter:
    """Writes summaries for one agent, and counts the ones that fail in a row."""

    def __init__(self, connection: Connection | None = None, system: str = "",
                 tools: dict | None = None, overhead: int = 0):
        self.connection, self.system, self.tools = connection, system, tools or {}
        self.overhead = overhead  # tokens of the system prompt and tools, in every request
        self.screen = connection.screen if connection else Screen()
        self.breaker = Breaker()  # a subagent's writer shares its agent's: one for the session
        self.unpaid = []          # (reply, label) of each call, for the loop to add up

    def say(self, text: str, style: str = "") -> None:
        say_on(self.screen, text, style)

    def bills(self) -> list:
        """What the calls cost since last asked: each (reply, label), handed over once."""
        unpaid, self.unpaid = self.unpaid, []
        return unpaid

    @property
    def stopped(self) -> bool:
        """True after MAX_CONSECUTIVE_SUMMARY_FAILURES failed summaries in a row."""
        return self.breaker.failures >= MAX_CONSECUTIVE_SUMMARY_FAILURES

    def breaker_open(self) -> bool:
        """Whether the breaker stops summary calls (stopped), said the first time."""
        if not self.stopped:
            return False
        if not self.breaker.announced:
            self.say(f"[summary] {MAX_CONSECUTIVE_SUMMARY_FAILURES} summaries failed in a row; "
                     "no more summary calls this session. Compaction goes on with summaries "
                     "built without the model.")
            self.breaker.announced = True
        return True

    def write(self, messages: list, focus: str, limit: int, settings, counter, todos: list,
              asked=None) -> tuple:
        """(a summary of at most `limit` tokens, who wrote it), in every case. `asked` is the
        reply to the first request when it was asked for ahead (summary_ahead.py); `counter`
        measures messages (messages/token_counts.py); `todos` go into a summary built without
        the model."""
        why = (f"{MAX_CONSECUTIVE_SUMMARY_FAILURES} summary calls failed in a row, so no more "
               "are made")
        if not self.breaker_open():
            try:
                answer = self.with_model(messages, focus, limit, settings, counter, asked)
                if reply_problem(answer, limit):  # ask once more, for a shorter one
                    again = (f"{focus} Your last answer was too long, empty, or a tool call: "
                             f"write the summary as text, well under {limit:,} tokens.").strip()
                    answer = self.with_model(messages, again, limit, settings, counter)
                if reply_problem(answer, limit):
                    raise SummaryError(reply_problem(answer, limit))
                self.breaker.failures = 0
                return answer.summary, "the model"
            except SummaryError as err:
                self.breaker.failures += 1
                failures = f"{self.breaker.failures}/{MAX_CONSECUTIVE_SUMMARY_FAILURES}"
                self.say(f"[summary] failed ({failures}): {err}; using one built without the "
                         "model")
                why = "the summary call failed"
        elif asked and asked.answer:  # asked for before the breaker opened: paid for all the same
            self.unpaid.append((asked.answer, f"{LABEL} ahead (the breaker is open)"))
        return fallback_summary(messages, todos, limit, why), "fallback"

    def with_model(self, messages: list, focus: str, limit: int, settings, counter,
                   asked=None) -> Answer:
        """One summary's reply from the model, its first reply `asked` if there is one; raises
        SummaryError."""
        instruction = summary_instructions(focus, limit)
        fits, budget = self.fits(messages, instruction, settings, counter)
        for _ in range(SUMMARY_ATTEMPTS):
            first, asked = asked, None
            try:
                sent = messages if fits or first else self.in_pieces(
                    messages, budget, instruction, limit, settings)
                answer = first.reply() if first else summary_reply(
                    self.connection, *self.request(sent, instruction, settings))
            except ContextOverflow as err:
                self.learn(err)  # the window learned: the retries are sized to it
                settings = settings.resized(self.connection.endpoint.window)
                budget, fits = smaller_budget(budget, messages, err.overflow), False  # less by
                continue  # as much as it was over
            self.unpaid.append((answer, f"{LABEL}{' ahead' if first else ''}"))
            return answer
        raise SummaryError("too long to summarize even after leaving out the oldest messages")

    def learn(self, err: ContextOverflow) -> None:
        """What the endpoint's window is, from a request it refused (the loop resizes to it)."""
        learned = self.connection.endpoint.learn_from(err)
        if learned:
            self.say(learned, "layer")

    def fits(self, messages: list, instruction: str, settings, counter) -> tuple:
        """(whether the messages fit one request beside the instruction and the reply, the
        budget in tokens of a request's messages). Estimates are scaled by the endpoint's
        undercount; too close to call, the endpoint counts."""
        s, undercount = settings, self.connection.endpoint.undercount
        fixed = estimate_text_tokens(instruction) + s.summary_max_tokens
        budget = int((s.window - fixed - self.overhead) / undercount * ESTIMATE_MARGIN)
        estimate = counter.count(messages, self.overhead)
        needed = estimate * undercount + fixed
        if s.window * (1 - CLOSE_CALL) < needed <= s.window:
            request = marked_request(s.model, s.max_output, self.system, self.tools, messages,
                                     keep_recent=s.keep_recent, ttl=s.cache_ttl)
            counted = count_tokens(self.connection, request, estimate)
            if counted is not None:
                counter.anchor(counted, messages)
                needed = counted * undercount + fixed
        return needed <= s.window, budget

    def request(self, sent: list, instruction: str, settings) -> tuple:
        """(the request for a summary, its size in tokens): the conversation's request, the
        instruction at its end, room for the summary only."""
        s = settings
        request = marked_request(s.model, s.summary_max_tokens, self.system, self.tools, sent,
                                 keep_recent=s.keep_recent, ttl=s.cache_ttl, extra_text=instruction)
        return request, self.overhead + estimate_tokens(sent)

    def request_ahead(self, messages: list, focus: str, limit: int, settings, counter):
        """(the request, its size) for a summary asked for ahead, its oldest results cleared if
        need be; None when even so it is too big for one (it is written in pieces later)."""
        instruction = summary_instructions(focus, limit)
        fits, budget = self.fits(messages, instruction, settings, counter)
        sent = messages if fits else cleared_to_fit(messages, budget)
        return None if sent is None else self.request(sent, instruction, settings)

    def in_pieces(self, messages: list, budget: int, instruction: str, limit: int,
                  settings) -> list:
        """What the last request carries when the messages do not fit one: each piece that
        fit_in_pieces hands out summarized, its summary handed back."""
        pieces = fit_in_pieces(messages, budget, budget - settings.summary_max_tokens)
        try:
            sent = next(pieces)
            while True:
                answer = summary_reply(self.connection, *self.request(sent, instruction, settings))
                self.unpaid.append((answer, f"{LABEL}, a piece at a time"))
                problem = reply_problem(answer, limit)
                if problem:
                    raise SummaryError(f"a piece's summary: {problem}")
                sent = pieces.send(answer.summary)
        except StopIteration as done:
            return done.value
