"""What a model call cost, added up and logged; a history with each tool input too big parked.
The agent's values go down from here; what comes back is kept on the agent.

Machinery the chapter does not need. Nothing below command_line/ is handed the agent: a model
call returns an Answer, which carries its usage, and this adds it to the agent's totals and
writes it to the session log (session/session_log.py). What summaries written ahead and set
aside cost is added with the next call counted.
"""

from ..messages import Disk, park_oversized_inputs


def park_long_inputs(agent, messages: list, measure) -> list:
    """The history with each tool call's input too big for the context parked on disk
    (messages/tool_input.py)."""
    disk = Disk(agent.store, agent.say, agent.disk_warned)
    messages, agent.disk_warned = park_oversized_inputs(messages, measure, agent.state.counter,
                                                        agent.overhead, agent.settings.threshold,
                                                        disk)
    return messages


def count_call(agent, answer=None, label: str = "waiting for the model") -> None:
    """Add up what a call cost (the last call's usage, the session's totals) and log it, with
    what summaries cost since (compaction's writer, one written ahead and set aside, one of
    what snip cut)."""
    calls = agent.ahead.bills() + agent.snips.bills() + agent.writer.bills()
    calls += [(answer, label)] if answer else []
    mark = agent.ahead.log_mark(agent.settings) if agent.log else None
    for each, what in calls:
        figures = each.figures
        for key, value in figures.items():
            agent.usage_totals[key] = agent.usage_totals.get(key, 0) + value
        if each is answer:
            agent.state.last_usage = figures
        if agent.log:
            agent.log.call(each.context_tokens, bool(each.prompt_tokens), each.usage, what,
                           agent.settings, mark, each.seconds)
