"""What a command may do: shell words, command risks, the sandbox, running a command, undo.

What the rest of the program may use from this folder."""

from .command_risks import command_risks
from .command_runner import run_command
from .sandbox import find_sandbox, Sandbox, start_up_line
from .undo import Undo, undo_hooks
