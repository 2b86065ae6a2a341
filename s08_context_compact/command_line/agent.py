"""The Agent: what an agent loop runs with, and its LoopState, what one loop learns; the hooks
every session installs.

Machinery the chapter does not need to read: code.py's functions take the Agent and read a
few of its fields (the chapter names them). The Agent is made once for a session (start.py)
and holds what the folders below are handed as values, each made once: the Screen, the
Connection for model calls, the Store for what the layers save, the summary written ahead.
"""

import json
import time
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Callable, TextIO

from ..basics import definitions, Redactor, say_on, Screen
from ..messages import estimate_text_tokens, TokenCounter
from ..endpoint import Connection, Endpoint, send_request
from ..compaction import (ForTheLedger, Ledger, ledger_hooks, RepeatReads, Restorable, Settings,
                          SnipSummaries, Store, SummaryAhead, SummaryWriter)
from ..safety import ForUndo, Sandbox, Undo, undo_hooks
from ..session import SessionLog

MAX_STEPS_PER_TURN = 100            # model calls in one user turn before the loop stops and asks
SUBAGENT_MAX_STEPS = 30

HOOK_EVENTS = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop",
               "PreCompact", "RestoreContext", "PostCompact")


@dataclass
class LoopState:
    """What one agent loop learns while it runs. A subagent gets a new one, so it starts
    with nothing of its parent's: no todos, no reads, no exact size of its context."""
    counter: TokenCounter = field(default_factory=TokenCounter)
    last_usage: dict = field(default_factory=dict)
    todos: list = field(default_factory=list)
    loaded_skills: list = field(default_factory=list)
    repeat_reads: RepeatReads = field(default_factory=RepeatReads)  # read twice: a stub
    last_reply_at: float | None = None              # the clock at the last reply: cache warm?
    pending_compact: str | None = None              # the compact tool's focus, until the batch ends


@dataclass
class Agent:
    """What an agent loop runs with: the client, the settings, the workspace, what the
    session shares with subagents (endpoint, ledger, accounting), and the loop's state."""
    client: object                  # the SDK's client; naming its type would load the SDK
    settings: Settings              # every size in tokens, from the window (compaction/settings.py)
    workdir: Path                   # the workspace: files, .transcripts/, .task_outputs/
    system: str                     # the system prompt
    tools: dict                     # name -> Tool: each declared once (code.py, part 2)
    skills: dict = field(default_factory=dict)  # name -> skill found in the workspace
    hooks: dict = field(default_factory=dict)   # event -> the hooks fire_hooks runs
    confirm: Callable[[str], tuple] = None  # confirm(question) -> (allowed, reason)
    out: Callable[..., None] = print  # where what the user sees is written (say)
    label: str = ""                 # a subagent's name; "" for the main agent
    max_steps: int = MAX_STEPS_PER_TURN  # model calls in one turn before the loop stops
    show_status: bool = False       # a status line after each turn (terminals only)
    color: bool = False             # ANSI colours: a terminal, and NO_COLOR unset
    fit_width: bool = False         # output is a terminal: fit lines to its width
    spinner_to: TextIO | None = None  # a terminal stream for the waiting spinner
    secrets: Redactor = field(default_factory=Redactor)  # never shown or written, in any form
    log: SessionLog | None = None   # none for subagents
    endpoint: Endpoint = None       # shared with subagents; made from settings if not given
    ledger: Ledger = field(default_factory=Ledger)    # facts a summary must keep (ledger.py)
    undo: Undo = field(default_factory=Undo)          # what /undo puts back; shared with subagents
    sandbox: Sandbox = field(default_factory=Sandbox)  # how bash is confined (default: it is not)
    disk_warned: bool = False                         # a layer could not save: said once
    stats: dict = field(default_factory=dict)         # layer -> {"runs", "saved" tokens, "seconds"}
    usage_totals: dict = field(default_factory=dict)  # all calls of the session, summed
    state: LoopState = field(default_factory=LoopState)  # what one loop learns
    clock: Callable[[], float] = time.monotonic       # what the cache's life is measured on
    ahead: SummaryAhead = field(init=False)           # code.py's "Compact before you must"
    snips: SnipSummaries = field(init=False)          # what snip cut, summarized in the background
    writer: SummaryWriter = field(init=False)         # writes a summary; keeps the breaker

    def __post_init__(self):
        self.secrets = Redactor.of(self.secrets)  # a list of the values will do
        if self.endpoint is None:
            self.endpoint = Endpoint(self.settings.window)
        # made once, from values: the main agent's asks the model through its own connection
        writes_ahead = not self.label and self.client is not None
        self.ahead = SummaryAhead(send_request, self.connection) if writes_ahead else SummaryAhead()
        self.snips = (SnipSummaries(send_request, self.connection, self.store, self.ahead)
                      if writes_ahead else SnipSummaries())
        self.writer = SummaryWriter(self.connection, self.system, self.tools, self.overhead)

    @cached_property
    def screen(self) -> Screen:
        """What basics/terminal.py needs to show a line, made once from the fields above."""
        return Screen(self.out, self.color, self.fit_width, self.spinner_to, self.label,
                      self.secrets)

    @cached_property
    def say(self) -> Callable:
        """say(text, style="", cut=False): tell the user something (basics/terminal.py decides
        how it looks). A value made once: what is handed it holds a Screen, not the agent."""
        return partial(say_on, self.screen)

    def subagent(self) -> "Agent":
        tools = {name: tool for name, tool in self.tools.items() if not tool.subagent}
        sub = replace(self, tools=tools, label="task", max_steps=SUBAGENT_MAX_STEPS, log=None,
                      state=LoopState())
        # its own writer, but the session's breaker: summaries that failed here count there
        sub.writer.breaker = self.writer.breaker
        return sub

    @cached_property
    def connection(self) -> Connection:
        """What a model call needs (endpoint/model_calls.py): made once, shared by every call."""
        s = self.settings
        return Connection(self.client, self.endpoint, s.retry_base_seconds, s.idle_timeout,
                          self.screen, self.secrets, s.api_retries)

    @cached_property
    def store(self) -> Store:
        """Where the layers save what they remove (a subagent gets its own, same folders)."""
        return Store(self.workdir, self.secrets)

    def restorable(self, hooks: list) -> Restorable:
        """What can come back after a summary, as the loop has it now (hooks: what the
        RestoreContext hooks answered)."""
        return Restorable(hooks, self.ledger.reads, self.workdir, self.secrets, self.state.todos,
                          self.state.loaded_skills)

    @cached_property
    def overhead(self) -> int:
        """Tokens of the system prompt and tool definitions, sent with every request."""
        return estimate_text_tokens(self.system + json.dumps(definitions(self.tools)))


def install_hooks(agent: Agent, permission_hook: Callable) -> None:
    """Every hook event, with the lesson's permission check (permission_hook(agent) is the
    PreToolUse hook), the ledger's recorders and undo's record."""
    agent.hooks = {event: [] for event in HOOK_EVENTS}
    agent.hooks["PreToolUse"].append(permission_hook(agent))

    # Each is handed what it reads of the agent as it is when it runs: /clear puts in a new
    # ledger and a new loop state.
    def for_the_ledger(hook):
        return lambda event: hook(event, ForTheLedger(agent.workdir, agent.ledger, agent.secrets,
                                                      agent.state.todos))

    def for_undo(hook):
        return lambda event: hook(event, ForUndo(agent.undo, agent.workdir, agent.say))

    for event, hook in ledger_hooks().items():
        agent.hooks[event].append(for_the_ledger(hook))
    for event, hook in undo_hooks().items():
        agent.hooks[event].append(for_undo(hook))
