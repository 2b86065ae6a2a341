"""What a command or a tool call may do: shell words, command risks, the sandbox, running a
command, running the model's tool calls, undo.

What the rest of the program may use from this folder."""

from .command_risks import command_risks
from .command_runner import run_command
from .next_start import changed_by_command, passes_through
from .sandbox import find_sandbox, Sandbox, start_up_line
from .undo import ForUndo, Undo, undo_hooks
