"""A tool, declared once: what the model is told (its name, description and input schema),
the function that runs it, and what it does. Every room that cares about what a tool does
reads it here, so a new tool that writes files is recorded by /undo and the ledger the
moment it is declared: undo records the workspace before a tool that changes files, the
ledger notes what a tool reads, writes or runs, the permission check looks at the path it
touches, the sandbox tells the model about the tool that runs commands, and the work line
shows its main argument.

Machinery the chapter does not need: each tool is declared with it once, and definitions
gives every tool's definition as the API takes it.
"""

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class ToolCall:
    """What a handler is handed beside its arguments: the call's id (a saved output is named
    after it) and the history it was made in (a repeated read is found there)."""
    id: str
    history: list = field(default_factory=list)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict
    run: Callable = None            # run(agent, call: ToolCall, **arguments) -> the result's text
    main_argument: str = ""         # the argument a work line shows ("": all of them)
    reads: str = ""                 # the argument naming a file it reads
    writes: str = ""                # the argument naming a file it writes
    lists: str = ""                 # the argument naming a folder it lists
    runs: str = ""                  # the argument holding a command it runs
    subagent: bool = False          # it starts a subagent, which shows its own work
    changes: bool = False           # it may change files in a way no argument names

    @property
    def changes_files(self) -> bool:
        """Whether /undo records the workspace before it runs."""
        return bool(self.writes or self.runs or self.subagent or self.changes)

    @property
    def path_argument(self) -> str:
        """The argument naming the one file or folder it touches ("" when none)."""
        return self.writes or self.reads or self.lists

    def definition(self) -> dict:
        """As the API takes it."""
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema}


def definitions(tools: dict) -> list:
    """Every tool's definition, in the order declared."""
    return [tool.definition() for tool in tools.values()]
