"""File-system primitives shared by both packages: the pid-recording inter-process file lock, the
atomic file writer, and the state folder rule (:func:`state_dir`; standard library only, as the
CLI's daemon client reads it)."""

import os
from collections.abc import Mapping

__all__ = ["state_dir"]


def state_dir(env: Mapping[str, str]) -> str:
    """The state folder: ``$OPENCLAW_STATE_DIR`` (``~`` expanded, resolved) or ``~/.openclaw``."""
    raw = env.get("OPENCLAW_STATE_DIR", "").strip()
    return os.path.realpath(os.path.expanduser(raw)) if raw else os.path.expanduser("~/.openclaw")
