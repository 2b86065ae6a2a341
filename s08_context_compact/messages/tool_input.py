"""What the model sends as a tool's input, checked before anything uses it, and parked when
it is too big to keep in the context.

Checked: the input is a JSON object that fits the tool's schema, nests lists and objects
no deeper than MAX_INPUT_DEPTH (measured without recursion, before json.dumps, redaction
or the token estimate recurse over it), and holds no NUL character in a path or a
command, which the operating system cannot take. Each problem is said in words the model
can act on. Parked: a call whose input no longer fits the window keeps its short
arguments; the long ones go to .task_outputs/tool-results/ and a pointer stays.

Machinery the chapter does not need. The checks return a problem in words, or None:
check_tool_input for a call's input, todo_problem for a todo list, input_problem for whether
a reply's input can be kept in the history at all. refused_result is the answer to a call
whose input could not be read. park_oversized_inputs returns a new history and saves through
the store it is handed. Running a call that passed is the next job, and
command_line/tool_calls.py's.
"""

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

from ..basics import one_line
from .history import with_blocks

JSON_TYPES = {"string": str, "integer": int, "array": list, "object": dict, "boolean": bool}
# no tool takes more than 3 levels; Python's recursion ends near 1,000
MAX_INPUT_DEPTH = 64
OS_STRINGS = {"path": "a file path", "pattern": "a file pattern", "command": "a shell command"}
# a parked call keeps arguments this short, so it still reads as a call
PARK_ARGUMENT_CHARS = 200
JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
TOO_DEEP = (f"nests lists and objects more than {MAX_INPUT_DEPTH} levels deep; "
            "send the arguments as the tool's schema lists them, with nothing nested deeper")


def nesting_depth(value, limit: int = MAX_INPUT_DEPTH) -> int:
    """How many levels of lists and objects a JSON value nests, counted without recursion
    (counting stops once past limit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = (item.values() if isinstance(item, dict)
                    else item if isinstance(item, list)
                    else None)
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        todo.extend((child, depth + 1) for child in children)
    return deepest


def text_depth(text: str) -> int:
    """The same for JSON text too deep for json.loads: brackets outside strings, counted."""
    depth = deepest = 0
    for bracket in re.sub(r"[^\[\]{}]", "", JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def input_problem(value) -> str | None:
    """Why a tool call's input cannot be kept in the history as it came, or None: it is
    not a JSON object, or it nests too deep for anything to walk it safely."""
    depth = text_depth(value) if isinstance(value, str) else nesting_depth(value)
    if depth > MAX_INPUT_DEPTH:  # first: json.dumps below recurses
        return f"its input {TOO_DEEP}"
    if not isinstance(value, dict):
        return f"its input was not a JSON object (received {one_line(json.dumps(value), 80)})"
    return None


def check_tool_input(schema: dict, args) -> str | None:
    """Return what is wrong with a tool call's input, or None when it fits the schema.
    Arguments the schema does not list are not wrong (JSON Schema allows them); the call is
    run without them (command_line/tool_calls.py)."""
    if not isinstance(args, dict):
        return "the input must be a JSON object"
    if nesting_depth(args) > MAX_INPUT_DEPTH:  # first: everything after may recurse
        return f"the input {TOO_DEEP}"
    missing = [key for key in schema.get("required", []) if key not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for key, value in args.items():
        if key not in schema.get("properties", {}):
            continue
        expected = schema["properties"][key].get("type")
        python_type = JSON_TYPES.get(expected)
        wrong_bool = python_type is int and isinstance(value, bool)
        if python_type and (not isinstance(value, python_type) or wrong_bool):
            return f"argument '{key}' must be of type {expected}, got {type(value).__name__}"
        pattern = schema["properties"][key].get("pattern", "")
        if isinstance(value, str) and not re.search(pattern, value):
            return f"argument '{key}' must not be blank" if value.isspace() or not value else \
                f"argument '{key}' must match {schema['properties'][key]['pattern']}"
        if key in OS_STRINGS and isinstance(value, str) and "\0" in value:
            return (f"argument '{key}' contains a NUL character (\\u0000), "
                    f"which {OS_STRINGS[key]} cannot hold")
    return None


class Saves(Protocol):
    """Where a tool's input too long for the context is saved (compaction/store.py's Store)."""
    def save_output(self, tool_use_id: str, text: str) -> Path: ...


@dataclass(frozen=True)
class Disk:
    """Where a long input is saved, and how a failure to save is said:
    once (warned: said already)."""
    store: Saves
    say: Callable[..., None]
    warned: bool = False


def park_oversized_inputs(messages: list, measure, counter, overhead: int, threshold: int,
                          disk: Disk) -> tuple:
    """A call whose input makes its message bigger than half the threshold (the rule for a
    long prompt) has each long argument saved to disk and replaced by a pointer; the call
    itself ran with the whole input. Without this the history would never fit again.
    (the history, whether a failure to save has been said); counter is the loop's counter."""
    limit = threshold // 2
    if counter.count(messages, overhead) <= limit:
        # the whole context is smaller: no message in it can be over
        return messages, disk.warned
    calls = {}  # (message index, block index) -> the call with its long arguments parked
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not isinstance(message["content"], list) or \
                counter.size(message) <= limit:
            continue
        for k, block in enumerate(message["content"]):
            if block.get("type") == "tool_use":
                calls[i, k], warned = parked(block, measure, disk)
                disk = replace(disk, warned=warned)
    return with_blocks(messages, calls), disk.warned


def parked(block: dict, measure, disk: Disk) -> tuple:
    """(a tool_use block with its long arguments on disk: still valid, still readable, whether
    a failure to save has been said)."""
    args, saved, kept = block["input"], [], {}
    if not isinstance(args, dict):
        return block, disk.warned
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text) <= PARK_ARGUMENT_CHARS:
            kept[key] = value
            continue
        try:
            path = disk.store.save_output(f"{block['id']}-{key}", text)
        except OSError as err:
            if not disk.warned:  # said once, as the layers say it
                disk.say(f"[tool input] cannot save a long input of {block['name']} ({err}); "
                         "it stays in context.")
            return block, True
        kept[key] = (f"[parked: {len(text):,} characters, too many for the context window; "
                     f"saved at {path}, read_file shows it]")
        saved.append(str(path))
    if not saved:
        return block, disk.warned
    tokens = measure(json.dumps(args, ensure_ascii=False))
    disk.say(f"[tool input] the input of a {block['name']} call (about {tokens:,} tokens) "
             "does not fit the context window; "
             f"its long arguments were saved to {', '.join(saved)} "
             "and the history keeps a pointer.", "layer")
    return {**block, "input": kept}, disk.warned


def todo_problem(schema: dict, items: list) -> str | None:
    """What is wrong with a todo list todo_write was given, written for the model, or None."""
    for n, item in enumerate(items):
        problem = check_tool_input(schema, item)
        if problem or item["status"] not in ("pending", "in_progress", "completed"):
            return f"item {n}: {problem or 'status must be pending, in_progress or completed'}"
    if sum(item["status"] == "in_progress" for item in items) > 1:
        return "only one item may be in_progress at a time; mark the others pending or completed."
    return None


def refused_result(block: dict, why: str) -> dict:
    """The answer to a call whose input could not be read: what failed, and how to call again."""
    return {"type": "tool_result", "tool_use_id": block["id"], "is_error": True,
            "content": f"Error: this call to {block['name']} failed: {why}. "
                       "Call it again with a valid JSON object as its input."}
