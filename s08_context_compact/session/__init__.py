"""The session log: its lines, their checks, and repairing a log to resume it.

What the rest of the program may use from this folder."""

from .log_checks import trusted_lines
from .session_list import list_sessions
from .session_log import (find_session, LogSetup, log_lines, logged_endpoint, open_session_log,
                          records_of, SessionLog, SessionRefused)
