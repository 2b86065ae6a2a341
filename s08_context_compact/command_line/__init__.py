"""Start-up, the arguments, the REPL and its commands, the lines that report the work, a
session's picture, and the agent turned into the values the folders below take.

What the rest of the program may use from this folder."""

from .agent import Agent, HOOK_EVENTS, install_hooks, LoopState
from .cli import configure, run, say_what_start_up_found
from .repl import start_repl, terminal_confirm
from .startup import build_system_prompt, open_session
from .work_lines import TOOL_MARK, show_layer, show_tool_call, show_tool_result
from .session_picture import report_line
from .user_turns import (add_prompt, handle_command, Lesson, park_oversized_request,
                         record_interruption, say_status, take_line, turn_failed)
from .agent_values import count_call, park_long_inputs
from .start import build_agent, start_session
from .tool_calls import run_tool_calls
