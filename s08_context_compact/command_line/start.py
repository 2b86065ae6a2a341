"""The agent made from a configuration, and its session started: the skills found, the system
prompt, the banner and what start-up found, the undo store checked, the session log opened,
and the REPL (repl.py) handed the agent with the lesson's turn.

Machinery the chapter does not need: the lesson's tools and permission check come in as
values, since nothing here imports code.py.
"""

from dataclasses import replace
from functools import partial

from ..basics import discover_skills, OWN_SKILLS
from ..compaction import Settings
from .agent import Agent, install_hooks
from .cli import say_what_start_up_found
from .repl import start_repl, terminal_confirm
from .startup import build_system_prompt, open_session
from .user_turns import take_line


def build_agent(config, tools: dict, permission_hook) -> Agent:
    """The Agent, from the configuration cli.py read, with the lesson's tools and its hooks:
    the lesson's permission check first (permission_hook(agent) is the hook)."""
    compact_at = config.compaction.get("compact_at", 0)
    settings = replace(Settings.for_window(config.model, config.endpoint.window, compact_at),
                       idle_timeout=config.idle_timeout, api_retries=config.api_retries,
                       cache_ttl=config.cache_ttl,
                       **config.compaction)
    # a skill skipped is said after the banner
    skills = discover_skills([config.workdir / "skills", OWN_SKILLS], warn=config.notes.append)
    agent = Agent(client=config.client, settings=settings, workdir=config.workdir, skills=skills,
                 tools=config.sandbox.tools(tools), sandbox=config.sandbox,
                 endpoint=config.endpoint, confirm=terminal_confirm(config.interactive),
                 system=build_system_prompt(config.workdir, skills, config.instructions),
                 secrets=config.secrets, **config.display)
    install_hooks(agent, permission_hook)
    return agent


def start_session(config, tools: dict, permission_hook, lesson) -> int:
    """The agent built (build_agent); the banner, then what start-up found; the session
    opened (or resumed); the REPL."""
    agent = build_agent(config, tools, permission_hook)
    say_what_start_up_found(agent, config)
    agent.undo.at(config.workdir, agent.say).check_store()  # before a request could lose a file
    messages = open_session(agent, config.resume)
    return start_repl(agent, config.interactive, messages, partial(take_line, lesson=lesson))
