"""The agent turned into the values the machinery below takes: a model call's Connection, the
AheadLoop a summary written ahead reads (and the worker it writes with), a history with each
tool input too big parked. What those calls hand back is kept here, on the agent.

Machinery the chapter does not need: code.py (and user_turns.py) call model_connection,
ahead_loop and park_long_inputs where a call below command_line/ needs the agent's values;
nothing below command_line/ is ever handed the agent.
"""

import copy
from dataclasses import dataclass, replace
from functools import cache, partial

from ..basics import Screen, say_on
from ..endpoint import Connection
from ..messages import Disk, park_oversized_inputs


def park_long_inputs(agent, messages: list, measure) -> list:
    """The history with each tool call's input too big for the context parked on disk (tool_input.py)."""
    messages, agent.disk_warned = park_oversized_inputs(messages, measure, agent.state.counter, agent.overhead,
                                                        agent.settings.threshold,
                                                        Disk(agent.store, agent.say, agent.disk_warned))
    return messages


def model_connection(agent) -> Connection:
    """What a model call needs of the agent (model_calls.py); the usage each call reports is kept
    here: the last call's, and the session's totals."""
    def count(figures: dict) -> None:
        agent.state.last_usage = figures
        for key, value in figures.items():
            agent.usage_totals[key] = agent.usage_totals.get(key, 0) + value
    log = agent.log  # only a loop with a log has a summary ahead's mark to record
    mark = agent.state.ahead.log_mark(agent.settings) if log else None
    return Connection(agent.client, agent.endpoint, agent.settings, agent.screen, agent.secrets,
                      count, log, mark)


@dataclass(frozen=True)
class AheadLoop:
    """What the summary written ahead (compaction/summary_ahead.py) reads of the loop it writes
    summaries for, and keep(Settled), which hands back what a job came to."""
    settings: object
    overhead: int             # tokens of the system prompt and tools
    counter: object           # the loop's token counter
    screen: Screen            # what is said, and the spinner while the loop waits
    log: object               # the session log, or None
    failures: int             # summary failures in a row so far
    writes_ahead: bool        # the main agent, with a client: a subagent compacts as before
    worker: object            # worker(say): a copy of the agent for the worker, saying through say
    connect: object           # connect(worker, on_request), on its thread: its own client; close()
    billed: object            # billed(worker): (its usage, breaker said, summary failures in a row)
    keep: object              # keep(Settled): what a job was billed, and its summary call's outcome

    def say(self, text: str, style: str = "") -> None:
        say_on(self.screen, text, style)


def ahead_loop(agent) -> AheadLoop:
    """The agent's loop as the summary written ahead sees it; what a job settled is kept here:
    its usage in the session's totals, the breaker said, one more failure in a row or none."""
    def keep(settled) -> None:
        for kind, value in settled.usage.items():
            agent.usage_totals[kind] = agent.usage_totals.get(kind, 0) + value
        agent.breaker_announced = agent.breaker_announced or settled.breaker_announced  # said by the worker
        if settled.failed is not None:
            agent.summary_failures = agent.summary_failures + 1 if settled.failed else 0
    return AheadLoop(agent.settings, agent.overhead, agent.state.counter, agent.screen, agent.log,
                     agent.summary_failures, not agent.label and agent.client is not None,
                     partial(worker_agent, agent), connect_worker, worker_billed, keep)


def worker_agent(agent, say):
    """A copy of the agent for the worker: its own counter, usage and endpoint facts, no hooks,
    no log, nothing on screen (what it says goes to say). Its HTTP client the worker makes itself."""
    counter = copy.copy(agent.state.counter)
    counter.sizes = dict(counter.sizes)
    return replace(agent, out=say, spinner_to=None, log=None, hooks={}, usage_totals={}, show_status=False,
                   color=False, fit_width=False, confirm=None, endpoint=copy.copy(agent.endpoint),
                   state=replace(agent.state, counter=counter, ahead=None))


def connect_worker(worker, on_request):
    """The worker's own HTTP client, so that its connection can be cut: every request goes
    through on_request. Made on the worker's thread, with the certificates the first worker
    loaded (loading them takes tens of milliseconds). Returns what closes it."""
    import httpx2  # the SDK's HTTP library, loaded by now (a client made it)
    http = httpx2.Client(verify=tls_context(), event_hooks={"request": [on_request]})
    try:
        worker.client = worker.client.with_options(http_client=http)
    except BaseException:
        http.close()  # the worker will not run: nothing may keep its connections open
        raise
    return http.close


@cache
def tls_context():
    import httpx2
    return httpx2.create_ssl_context()  # as a client makes its own: the system's or SSL_CERT_FILE's


def worker_billed(worker) -> tuple:
    """What a worker was billed (a copy: a worker past its join may still add), whether it
    said the breaker opened, and its summary failures in a row."""
    return dict(worker.usage_totals), worker.breaker_announced, worker.summary_failures
