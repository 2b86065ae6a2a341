"""The Anthropic SDK and its HTTP library, loaded the first time one of their names is
used, and the client made from them.

Machinery the chapter does not need. It only loads the SDK and makes the client: sending a
request with it, and retrying, is model_calls.py's job, beside it.
"""

import importlib.util
import os
import sys


def lazy_import(name: str):
    """A module that loads the first time one of its names is used. The SDK takes a second
    or two to import, and --help, --list or a missing key need none of it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None  # not installed: main() says how to install it
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


anthropic = lazy_import("anthropic")  # the official SDK
# The SDK's HTTP library: its errors can surface while a stream is being read.
httpx2 = lazy_import("httpx2")


def make_client(connect: float, idle: float):
    """The SDK client. A token wins over a key: a proxy that asks for a token must never be
    sent the Anthropic key that happens to be in the shell. Retries are ours, so each one
    can be seen (with_retries)."""
    token = os.getenv("ANTHROPIC_AUTH_TOKEN")
    if token:
        credential = {"auth_token": token}
    else:
        credential = {"api_key": os.environ["ANTHROPIC_API_KEY"]}
    if token and os.getenv("ANTHROPIC_API_KEY"):
        print("Using ANTHROPIC_AUTH_TOKEN; ANTHROPIC_API_KEY is set too and is not sent.",
              file=sys.stderr)
    timeout = anthropic.Timeout(idle, connect=connect)
    return anthropic.Anthropic(**credential, max_retries=0, timeout=timeout)
