"""The agent made from a configuration, and its session started: the skills found, the system
prompt, the banner and what start-up found, the undo store checked, the session log opened,
and the REPL (repl.py) handed the agent with the lesson's turn.

Machinery the chapter does not need: the lesson's Agent class, tools and hooks come in as
values (make, tools, install_hooks), since nothing here imports code.py.
"""

from dataclasses import replace
from functools import partial

from ..basics import discover_skills, OWN_SKILLS
from ..compaction import Settings
from .cli import say_what_start_up_found
from .repl import start_repl, terminal_confirm
from .startup import build_system_prompt, open_session
from .user_turns import take_line


def build_agent(config, make, tools: dict, install_hooks):
    """make(...): the lesson's Agent, from the configuration cli.py read, its hooks installed."""
    compact_at = config.compaction.get("compact_at", 0)
    settings = replace(Settings.for_window(config.model, config.endpoint.window, compact_at),
                       idle_timeout=config.idle_timeout, cache_ttl=config.cache_ttl,
                       **config.compaction)
    # a skill skipped is said after the banner
    skills = discover_skills([config.workdir / "skills", OWN_SKILLS], warn=config.notes.append)
    agent = make(client=config.client, settings=settings, workdir=config.workdir, skills=skills,
                 tools=config.sandbox.tools(tools), sandbox=config.sandbox,
                 endpoint=config.endpoint, confirm=terminal_confirm(config.interactive),
                 system=build_system_prompt(config.workdir, skills, config.instructions),
                 secrets=config.secrets, **config.display)
    install_hooks(agent)
    return agent


def start_session(agent, config, lesson) -> int:
    """The banner, then what start-up found; the session opened (or resumed); the REPL."""
    say_what_start_up_found(agent, config)
    agent.undo.at(config.workdir, agent.say).check_store()  # before a request could lose a file
    messages = open_session(agent, config.resume)
    return start_repl(agent, config.interactive, messages, partial(take_line, lesson=lesson))
