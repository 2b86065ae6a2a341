"""The user's side of a turn: a line typed (a prompt on its way into the history, or a
command), and what the person is told when a turn cannot go on.

A prompt too big to send is saved to a file and the model is asked to read it. After
Ctrl-C the history says the work was cancelled. A prompt the model never answered (an API
error) is taken back out, so that sending it again does not send it twice. /undo and /redo
put files back (undo.py), and the model is told.

Machinery the chapter does not need. take_line takes one typed line: a prompt goes on to
the lesson's take_turn (handed over in a Lesson, as nothing here imports code.py), a command
to handle_command (/compact runs the lesson's compact_now, /clear starts a new
conversation, the others report). The rest are the steps around a turn's teaching parts
(the hooks, the loop): a prompt added, an interruption recorded, a failure explained. The
lines about the context come from work_lines.py, beside it.
"""

from dataclasses import dataclass
from typing import Callable

from ..compaction import Ledger
from ..endpoint import ContextOverflow, explain_api_error
from ..messages import (append_message, blocks_of, estimate_text_tokens, own_text,
                        replace_history, with_text)
from .work_lines import context_breakdown, status_line
from .session_picture import report_line
from ..basics import printable
from .agent import LoopState
from .agent_values import count_call, park_long_inputs
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
        agent.say(f"Your message is about {tokens:,} tokens, "
                  "more than half the context window allows, "
                  f"and it could not be saved to a file ({err}). "
                  "It was not sent: put it in a file and ask me to read it.")
        return None
    agent.say(f"(Your message is about {tokens:,} tokens, too big to send whole; it was saved to "
              f"{path} and the model will read it from there.)")
    return (f"My message is too long to send whole (about {tokens:,} tokens). It is saved at "
            f"{path}: read it in parts with read_file and do what it asks.")


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
            content = [{**b, "text": pointer} if b.get("text") == request["text"] else b
                       for b in blocks_of(messages[i])]
            return messages[:i] + [{**messages[i], "content": content}] + messages[i + 1:]
    return messages


INTERRUPTED = ("[Interrupted by the user: this request was cancelled. "
               "Do not resume it unless the user asks.]")


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
        agent.say(f"API error: {err}, even after compacting. "
                  "The conversation is kept: try /compact, or set CONTEXT_WINDOW lower.", "error")
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


def say_status(agent, messages: list, tokens: int) -> None:
    """After a turn on a terminal: how full the context is, and how far from auto-compact."""
    if agent.show_status:
        exact = agent.state.counter.measures(messages)
        agent.say(status_line(agent.settings, tokens, exact=exact), "dim")


@dataclass(frozen=True)
class Lesson:
    """What a line typed at the prompt reaches in code.py, which nothing here imports."""
    take_turn: Callable   # take_turn(agent, messages, prompt): False when an API error ended it
    compact: Callable     # compact_now(agent, messages, focus): the history, compacted
    context_tokens: Callable  # context_tokens(agent, messages): what the next request will carry


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
    every command then says what it did (say_command_done)."""
    command, _, focus = line.partition(" ")
    if command == "/compact" and messages:
        compacted = lesson.compact(agent, messages, focus.strip())
        replace_history(agent.log, messages, compacted, "/compact")
    elif command == "/clear":
        agent.ahead.drop("/clear")
        agent.snips.drop()
        count_call(agent)  # what it cost, logged
        replace_history(agent.log, messages, [], "/clear")
        # a new conversation: nothing read, no todos, no facts
        agent.state, agent.ledger = LoopState(), Ledger()
    tokens = lesson.context_tokens(agent, messages)
    return say_command_done(agent, messages, command, tokens)


def say_command_done(agent, messages: list, command: str, tokens: int) -> bool:
    """What a command says once it has run; True, for a command is never an API error."""
    if command == "/help":
        agent.say(HELP)
    elif command == "/context":
        agent.say(context_breakdown(agent, messages, tokens, measure=estimate_text_tokens))
    elif command == "/compact":
        if not messages:
            agent.say("Nothing to compact yet.")
        say_status(agent, messages, tokens)
    elif command == "/clear":
        agent.say("(A new conversation. The session log keeps the old one: "
                  "--resume cannot bring it back, but .transcripts/ has every message.)")
    elif command == "/report":
        said, address = report_line(agent.log.path if agent.log and agent.log.file else None)
        agent.say(said)
        if address:
            agent.out(printable(address))  # whole, to copy or click
    elif command in ("/undo", "/redo"):
        said = agent.undo.at(agent.workdir, agent.say).step(back=command == "/undo")
        agent.say(said)
        changed = agent.sandbox.look_again()  # a file put back may be one the next start reads
        if changed:
            agent.say(changed.strip())
        # Its files changed back: the model is told.
        note = own_text("note", f"[Program note: the user ran {command}. {said}]")
        if said.startswith("[") and messages and messages[-1]["role"] == "user":
            noted = messages[:-1] + [with_text(messages[-1], note)]
            replace_history(agent.log, messages, noted, command)
        elif said.startswith("[") and messages:
            told = {"role": "user", "content": [note]}
            append_message(agent.log, agent.state.counter, messages, told)
    else:
        agent.say(f"Unknown command {command}. Type /help for the list.")
    return True
