"""The user's side of a turn: a prompt on its way into the history, what the person is
told when a turn cannot go on, and the commands that only report.

A prompt too big to send is saved to a file and the model is asked to read it. After
Ctrl-C the history says the work was cancelled. A prompt
the model never answered (an API error) is taken back out, so that sending it again does
not send it twice. /undo and /redo put files back (undo.py), and the model is told.

Machinery the chapter does not need: the REPL hands each line to take_line, which hands a
prompt to code.py's take_turn (given in a Lesson, as nothing here imports code.py) and runs
a command (handle_command: /compact calls code.py's run_compact_history). take_turn calls
these around the parts that teach (the hooks, the loop), and its model calls
take the Connection model_connection makes of the agent, and its summary written ahead the
AheadLoop ahead_loop makes.
"""

import copy
from dataclasses import dataclass, replace
from functools import cache, partial

from ..compaction import Ledger
from ..endpoint import Connection, ContextOverflow, explain_api_error
from ..messages import (Disk, append_message, blocks_of, estimate_text_tokens, own_text,
                        park_oversized_inputs, replace_history, with_text)
from .work_lines import context_report, status_line
from .session_picture import report_line
from ..basics import Screen, printable, say_on
from .repl import HELP


def add_prompt(agent, messages: list, prompt: str, tokens: int) -> dict | None:
    """Put the user's prompt into the history (parked in a file first when it is more than
    half the threshold) and the session log; return its block, or None if it was not sent."""
    if tokens > agent.settings.threshold // 2:
        prompt = park_long_prompt(agent, prompt, tokens)
        if prompt is None:
            return None
    merged = add_user_text(messages, prompt)
    if agent.log:
        agent.log.message(messages[-1], prompt=prompt, merged=merged)
    return blocks_of(messages[-1])[-1]  # this very block is withdrawn if the model never answers it


def add_user_text(messages: list, text: str) -> bool:
    """Append the user's words; after an interruption they join the pending user message
    (True then), so roles keep alternating."""
    if messages and messages[-1]["role"] == "user":
        messages[-1] = with_text(messages[-1], text)
        return True
    messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return False


def park_long_prompt(agent, prompt: str, tokens: int) -> str | None:
    """A message too big to send is saved to a file, and the model is asked to read it."""
    try:
        path = agent.store.save_prompt(prompt)
    except OSError as err:
        agent.say(f"Your message is about {tokens:,} tokens, more than half the context window allows, and it "
                  f"could not be saved to a file ({err}). It was not sent: put it in a file and ask me to read it.")
        return None
    agent.say(f"(Your message is about {tokens:,} tokens, too big to send whole; it was saved to "
              f"{path} and the model will read it from there.)")
    return (f"My message is too long to send whole (about {tokens:,} tokens). It is saved at "
            f"{path}: read it in parts with read_file and do what it asks.")


def park_long_inputs(agent, messages: list, measure) -> list:
    """The history with each tool call's input too big for the context parked on disk (tool_input.py)."""
    messages, agent.disk_warned = park_oversized_inputs(messages, measure, agent.state.counter, agent.overhead,
                                                        agent.settings.threshold,
                                                        Disk(agent.store, agent.say, agent.disk_warned))
    return messages


def park_oversized_request(agent, messages: list, request: dict | None, measure) -> list:
    """After the window shrank, the request being worked on, if too big for it now, is moved
    to a file (as a long prompt is from the start), so the retry is not refused for its size
    again; so is a tool call's input too big for it."""
    messages = park_long_inputs(agent, messages, measure)
    if not request or measure(request["text"]) <= agent.settings.threshold // 2:
        return messages
    pointer = park_long_prompt(agent, request["text"], measure(request["text"]))
    for i in range(len(messages) - 1, -1, -1):
        texts = [b.get("text") for b in blocks_of(messages[i])]
        if pointer and messages[i]["role"] == "user" and request["text"] in texts:
            content = [{**b, "text": pointer} if b.get("text") == request["text"] else b for b in blocks_of(messages[i])]
            return messages[:i] + [{**messages[i], "content": content}] + messages[i + 1:]
    return messages


INTERRUPTED = "[Interrupted by the user: this request was cancelled. Do not resume it unless the user asks.]"


def record_interruption(agent, messages: list, shown: str) -> None:
    """After Ctrl-C, the history says so: the reply the user saw stream (if any) is kept,
    marked interrupted, and the model is told the work was cancelled. The next prompt is
    then a message of its own, not merged into the cancelled one."""
    if not messages or messages[-1]["role"] != "user":
        return
    said = f"{shown.rstrip()}\n\n{INTERRUPTED}" if shown.strip() else INTERRUPTED
    append_message(agent.log, agent.state.counter, messages,
                   {"role": "assistant", "content": [own_text("interrupted", said)]})


def turn_failed(agent, messages: list, asked: dict, err: Exception) -> None:
    """Say why the turn ended. After "too long" even once compacted the conversation is kept;
    after any other API error the unanswered prompt is taken back out."""
    if isinstance(err, ContextOverflow):
        agent.say(f"API error: {err}, even after compacting. The conversation is kept: try /compact, "
                  "or set CONTEXT_WINDOW lower.", "error")
        return
    withdrawn = withdraw_unanswered_prompt(agent, messages, asked)
    agent.say(explain_api_error(err, withdrawn=withdrawn, terminal=agent.fit_width), "error")


def withdraw_unanswered_prompt(agent, messages: list, asked: dict) -> bool:
    """Only that block goes: a summary it was merged into, or anything else, stays. The
    session log keeps a record of it."""
    if not messages or not any(block is asked for block in blocks_of(messages[-1])):
        return False
    rest = [block for block in blocks_of(messages[-1]) if block is not asked]
    new = messages[:-1] + ([{**messages[-1], "content": rest}] if rest else [])
    replace_history(agent.log, messages, new, "prompt not answered (API error)")
    return True


def show_status(agent, messages: list, tokens: int) -> None:
    """After a turn on a terminal: how full the context is, and how far from auto-compact."""
    if agent.show_status:
        agent.say(status_line(agent.settings, tokens, exact=agent.state.counter.measures(messages)), "dim")


@dataclass(frozen=True)
class Lesson:
    """What a line typed at the prompt reaches in code.py, which nothing here imports."""
    take_turn: object   # take_turn(agent, messages, prompt): False when an API error ended it
    compact: object     # run_compact_history(agent, messages, focus): the history, compacted
    new_state: object   # LoopState: what a new conversation (/clear) starts from
    context_tokens: object  # context_tokens(agent, messages): what the next request will carry


def take_line(agent, messages: list, line: str, lesson: Lesson) -> bool:
    """A command or a prompt; False when it ended in an API error. After Ctrl-C the history
    says so (a layer only replaces the history when done, so it is intact)."""
    try:
        if line.startswith("/"):
            return handle_command(agent, messages, line, lesson)
        return lesson.take_turn(agent, messages, line)
    except KeyboardInterrupt as stop:
        record_interruption(agent, messages, getattr(stop, "partial", ""))
        agent.say("\n(interrupted; the conversation is kept, type your next message)")
        return True


def handle_command(agent, messages: list, line: str, lesson: Lesson) -> bool:
    """/compact summarizes now, with an optional focus; /clear starts a new conversation;
    every command then says what it did (report_command)."""
    command, _, focus = line.partition(" ")
    if command == "/compact" and messages:
        compacted = lesson.compact(agent, messages, focus.strip())
        replace_history(agent.log, messages, compacted, "/compact")
    elif command == "/clear":
        agent.state.ahead.drop(ahead_loop(agent), "/clear")
        replace_history(agent.log, messages, [], "/clear")
        # a new conversation: nothing read, no todos, no facts
        agent.state, agent.ledger = lesson.new_state(), Ledger()
    tokens = lesson.context_tokens(agent, messages)
    return report_command(agent, messages, command, tokens, estimate_text_tokens)


def report_command(agent, messages: list, command: str, tokens: int, measure) -> bool:
    """What a command says once it has run; True, for a command is never an API error."""
    if command == "/help":
        agent.say(HELP)
    elif command == "/context":
        agent.say(context_report(agent, messages, tokens, measure=measure))
    elif command == "/compact":
        if not messages:
            agent.say("Nothing to compact yet.")
        show_status(agent, messages, tokens)
    elif command == "/clear":
        agent.say("(A new conversation. The session log keeps the old one: --resume cannot bring it back, "
                  "but .transcripts/ has every message.)")
    elif command == "/report":
        said, address = report_line(agent.log.path if agent.log and agent.log.file else None)
        agent.say(said)
        if address:
            agent.out(printable(address))  # whole, to copy or click
    elif command in ("/undo", "/redo"):
        said = agent.undo.at(agent.workdir, agent.say).step(back=command == "/undo")
        agent.say(said)
        note = own_text("note", f"[Program note: the user ran {command}. {said}]")  # its files changed back
        if said.startswith("[") and messages and messages[-1]["role"] == "user":
            replace_history(agent.log, messages, messages[:-1] + [with_text(messages[-1], note)], command)
        elif said.startswith("[") and messages:
            append_message(agent.log, agent.state.counter, messages, {"role": "user", "content": [note]})
    else:
        agent.say(f"Unknown command {command}. Type /help for the list.")
    return True


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
    worker.client = worker.client.with_options(http_client=http)
    return http.close


@cache
def tls_context():
    import httpx2
    return httpx2.create_ssl_context()  # as a client makes its own: the system's or SSL_CERT_FILE's


def worker_billed(worker) -> tuple:
    """What a worker was billed (a copy: a worker past its join may still add), whether it
    said the breaker opened, and its summary failures in a row."""
    return dict(worker.usage_totals), worker.breaker_announced, worker.summary_failures
