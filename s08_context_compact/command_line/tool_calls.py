"""Running the model's tool calls: each is checked against its tool's schema, let through or
refused by the PreToolUse hooks (the permission check is one), run, its output redacted,
then shown and answered with a tool_result. A batch cut short by Ctrl-C answers every call
left, so no tool_use goes unanswered.

Machinery the chapter does not need: the lesson's fire_hooks comes as a value (`fire`), each
call runs its tool's own handler, and the tool_results go back for the loop to append.
"""

from typing import Callable

from ..basics import Spinner, Tool, ToolCall, ToolError, redact, well_formed
from ..endpoint import ContextOverflow, api_failures
from ..messages import check_tool_input, refused_result
from .work_lines import show_tool_call, show_tool_result


def run_tool_calls(agent, fire: Callable, tool_uses: list, refused: dict, history: list) -> tuple:
    """(a tool_result for every call, in order; whether Ctrl-C cut the batch short). A call
    whose input could not be read (refused) is answered with why; each handler is handed
    the history the calls were made in."""
    results = []
    try:
        for block in tool_uses:
            if block["id"] in refused:
                why = refused[block["id"]]
                show_tool_result(agent, block["name"], {}, f"{block['name']}: {why}",
                                 failed=True)
                results.append(refused_result(block, why))
            else:
                results.append(answer_call(agent, fire, block, history))
        return results, False
    except KeyboardInterrupt as stop:
        ended = getattr(stop, "__notes__", None)  # what run_command ended, as SIGTERM's exit says
        if ended:
            agent.say(" ".join(ended), "dim")
        for block in tool_uses[len(results):]:
            results.append({"type": "tool_result", "tool_use_id": block["id"], "is_error": True,
                            "content": "Interrupted by the user before this finished."})
        return results, True


def answer_call(agent, fire: Callable, block: dict, history: list) -> dict:
    """Run one tool call through the hooks; always returns a tool_result block. The hooks
    are told the tool's declaration, and read what it does there."""
    name, args = block["name"], block["input"]
    show_tool_call(agent, name, args)  # "● bash  wc -l *.py" (command_line/work_lines.py)
    tool = agent.tools.get(name)
    schema = tool.input_schema if tool else None
    problem = check_tool_input(schema, args) if schema else None
    denied = []
    if schema and not problem:
        answers = fire(agent, "PreToolUse", name=name, input=args, tool=tool)
        denied = [answer["deny"] for answer in answers if "deny" in answer]
    if schema is None:
        available = ", ".join(agent.tools)
        output, failed = f"Error: unknown tool '{name}'. Available tools: {available}.", True
    elif problem:
        output = f"Error: {name} was called wrongly: {problem}. Call it again with valid input."
        failed = True
    elif denied:
        output, failed = denied[0], True
    else:
        output, failed = call_handler(agent, tool, ToolCall(block["id"], history), args)
        # a file tool may reach the program's own .env by another name
        output += agent.sandbox.look_again()
        fire(agent, "PostToolUse", name=name, input=args, output=output, is_error=failed,
                 tool=tool)
    # A path or a name with bytes that are not UTF-8, as U+FFFD (a request cannot carry them);
    # then no secret a tool printed reaches the model or the disk.
    output = redact(well_formed(output), agent.secrets)
    show_tool_result(agent, name, args, output, failed)  # a preview; for an edit, its −/+ lines
    result = {"type": "tool_result", "tool_use_id": block["id"], "content": output}
    return {**result, "is_error": True} if failed else result


def call_handler(agent, tool: Tool, call: ToolCall, args: dict) -> tuple:
    """(output, failed) of a call the hooks allowed; a tool's own error is its output, and
    arguments its schema does not list are left out, and named."""
    name = tool.name
    listed = tool.input_schema.get("properties", {})
    known = {key: value for key, value in args.items() if key in listed}
    spinner_to = None if tool.subagent else agent.spinner_to  # a subagent shows its own work
    try:
        with Spinner(spinner_to, f"running {name}"):
            output, failed = tool.run(agent, call, **known), False
    except ToolError as err:
        output, failed = f"Error: {err}", True
    except (OSError, ValueError, ContextOverflow, *api_failures()) as err:
        output, failed = f"Error: {name} failed: {type(err).__name__}: {err}", True
    ignored = sorted(set(args) - set(known))
    if ignored:
        output += f"\n(ignored argument(s) {name} does not take: {', '.join(ignored)})"
    return output, failed
