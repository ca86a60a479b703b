"""What the environment gives a config: ``${VAR}`` references in config strings, substituted as
OpenClaw substitutes them (docs/configuration.md, "The config file"), and the state folder
(:func:`state_dir`, ``$OPENCLAW_STATE_DIR``).

Only upper-case names (``[A-Z_][A-Z0-9_]*``) are references; ``$${VAR}`` is the literal text
``${VAR}``; an unset or empty variable leaves its reference as written, with a config warning,
except an API key that is that reference alone: it becomes the variable's SecretRef, so no
literal ``${VAR}`` is sent as a key. Standard library only (and ``fallback.fs``, the state
folder rule's owner): the daemon client stamps a config with :func:`env_stamp` before it loads anything.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

from fallback.fs import state_dir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the daemon client skips it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["env_stamp", "state_dir", "substitute_env"]

# The keys whose value alone a reference to an unset variable turns into its SecretRef (and
# OpenClaw's ``models.providers.<id>.apiKey``).
SECRET_KEYS = ("remote.apiKey", "rerank.apiKey")
_PROVIDER_KEY = re.compile(r"models\.providers\.[^.]+\.apiKey")
# ``${NAME}``, or ``$${NAME}`` (group 1 is then ``$``): the escaped, literal form.
_REFERENCE = re.compile(r"\$(\$?)\{([A-Z_][A-Z0-9_]*)\}")


def substitute_env(data: Any, env: Mapping[str, str]) -> tuple[Any, list[str]]:
    """``data`` (a parsed JSON5 document) with each ``${NAME}`` in its strings replaced by
    ``env[NAME]``, and one warning per reference left as written (``agents.defaults.workspace:
    ${AGENT_HOME} is not set; left as written``). Keys are not substituted."""
    warnings: list[str] = []

    def text(value: str, key: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(1):
                return m.group(0)[1:]
            found = env.get(m.group(2), "")
            if not found:
                warnings.append(f"{key or '<root>'}: ${{{m.group(2)}}} is not set; left as written")
                return m.group(0)
            return found

        return _REFERENCE.sub(one, value)

    def walk(value: Any, key: str) -> Any:
        if isinstance(value, str):
            alone = _REFERENCE.fullmatch(value)
            if alone and not alone.group(1) and (key.endswith(SECRET_KEYS) or _PROVIDER_KEY.fullmatch(key)) \
                    and not env.get(alone.group(2)):
                text(value, key)  # the warning
                return {"source": "env", "provider": "default", "id": alone.group(2)}
            return text(value, key) if "${" in value else value
        if isinstance(value, dict):
            return {k: walk(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(data, ""), warnings


def env_stamp(config_text: str, env: Mapping[str, str]) -> str | None:
    """A stamp of the values of the variables ``config_text`` references (CRC-32 of their
    ``NAME=value`` lines: a changed value changes it, and no value is kept), or ``None`` when it
    references none."""
    names = sorted({m.group(2) for m in _REFERENCE.finditer(config_text) if not m.group(1)})
    if not names:
        return None
    lines = "\n".join(f"{name}={env.get(name, '')}" for name in names)
    return f"{zlib.crc32(lines.encode('utf-8', 'surrogatepass')):08x}"


