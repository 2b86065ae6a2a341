"""Secrets: which values must never leave the program, and how they are taken out.

Machinery the chapter does not need: code.py redacts what enters the history and keeps a
last net over every request, log record and saved file; this module says what a secret
is and does the replacing.
"""

import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^:/@\s]*:([^@/\s]{8,})@", re.IGNORECASE)
# The program's own settings: a request carries the model's id, so these are not secrets.
SETTINGS_NAMES = ("MODEL_ID", "ANTHROPIC_BASE_URL", "CONTEXT_WINDOW", "API_CONNECT_TIMEOUT", "API_IDLE_TIMEOUT",
                  "CACHE_TTL", "S08_HISTORY")
REDACTED = "[redacted]"


def secret_values(environ, dotenv_files: tuple = ()) -> list:
    """What must never reach the model, a log or a file, longest first: values of
    environment variables named like secrets; every value of 8 or more characters in the
    workspace's .env files (this program's own settings aside); and the password of any
    user:password@host URL among all of them."""
    values = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= 8}
    urls = set(environ.values())  # ANTHROPIC_BASE_URL may carry a proxy's password
    for found in dotenv_files:
        values |= {v for k, v in found.items() if v and len(v) >= 8 and k not in SETTINGS_NAMES}
        urls |= {v for v in found.values() if v}
    values |= {m for v in values | urls for m in URL_PASSWORD.findall(v)}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: list) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_deep(value, secrets: list):
    """A request (or any JSON value) with every secret in its strings replaced. What holds
    no secret comes back as the same object, so a clean history is walked, not copied."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        items = {key: redact_deep(item, secrets) for key, item in value.items()}
        return value if all(items[key] is item for key, item in value.items()) else items
    if isinstance(value, list):
        items = [redact_deep(item, secrets) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else items
    return value


def redact_bytes(data: bytes, secrets: list) -> bytes:
    """The same for raw bytes (a command's output); secrets given as encoded bytes."""
    for value in secrets:
        data = data.replace(value, REDACTED.encode())
    return data
