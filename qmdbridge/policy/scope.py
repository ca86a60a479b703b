"""Scope rules: which session keys may search memory (and, re-exported from
``qmdbridge/policy/citations.py``, whether citations are shown).

The reference system's rules, with two decisions of ours: no session key is an owner call,
always allowed; a denial names the deciding rule and the derived chat type and channel. Key
shapes: docs/mcp-daemon.md, "Session keys and scope".
"""

from __future__ import annotations

from collections.abc import Sequence

from fallback.models import ScopeDecision
from qmdbridge.config import QmdScope, ScopeRule
from qmdbridge.policy.citations import session_key_rest

__all__ = ["derive_chat", "evaluate_scope", "normalize_session_key", "scope_candidates"]

_CHAT_MARKERS = ("group", "channel", "direct", "dm")
# The config key a denial names, so the reason says what to change.
SCOPE_KEY = "memory.qmd.scope"
# Channels with opaque, case-sensitive ids (Signal's base64, Matrix's ``!AbC:server``): ids keep their case.
_CASE_SENSITIVE_ID_CHANNELS = ("signal", "matrix")


def normalize_session_key(key: str | None) -> str | None:
    """A session key normalised for scope matching (spec 2.12 step 1): trimmed, ``agent:<id>:``
    stripped, lower-cased (``signal`` and ``matrix`` keys: only the first two parts, so opaque
    ids keep their case); ``None`` for a missing or blank key and for a sub-agent key."""
    trimmed = (key or "").strip()
    if not trimmed:
        return None
    rest = session_key_rest(trimmed)
    if rest.lower().startswith("subagent:"):
        return None
    parts = [p for p in rest.split(":") if p]
    if len(parts) >= 3 and parts[0].lower() in _CASE_SENSITIVE_ID_CHANNELS:
        return ":".join([parts[0].lower(), parts[1].lower(), *parts[2:]])
    return rest.lower()


def derive_chat(key: str | None) -> tuple[str | None, str | None]:
    """``(chat_type, channel)`` of a session key (spec 2.12 step 2): when the normalised
    key's second part is ``group``, ``channel``, ``direct`` or ``dm``, the channel is the first
    part and the chat type ``group`` if any part is ``group``, else ``channel`` if any part is,
    else ``direct``; otherwise ``:group:`` / ``:channel:`` in the key decide, with no channel.
    ``(None, None)`` without a normalised key."""
    norm = normalize_session_key(key)
    if norm is None:
        return None, None
    parts = [p for p in norm.split(":") if p]
    if len(parts) >= 2 and parts[1].lower() in _CHAT_MARKERS:
        lowered = [p.lower() for p in parts]
        return next((t for t in ("group", "channel") if t in lowered), "direct"), parts[0]
    if ":group:" in norm:
        return "group", None
    if ":channel:" in norm:
        return "channel", None
    return "direct", None


def _rule_matches(rule: ScopeRule, *, raw_lower: str, norm: str | None,
                  chat_type: str | None, channel: str | None) -> bool:
    match = rule.match
    if match.channel is not None and (channel is None
                                      or match.channel.strip().lower() != channel.lower()):
        return False
    wanted = "direct" if match.chat_type == "dm" else match.chat_type
    if wanted is not None and chat_type != wanted:
        return False
    if match.raw_key_prefix is not None and not raw_lower.startswith(
            match.raw_key_prefix.strip().lower()):
        return False
    if match.key_prefix is None:
        return True
    prefix = match.key_prefix.strip().lower()
    if prefix.startswith("agent:"):  # legacy configs wrote agent-qualified prefixes: the raw key's
        return raw_lower.startswith(prefix)
    return norm is not None and norm.lower().startswith(prefix)


def _decide(scope: QmdScope, key: str) -> ScopeDecision:
    """The rules for one session key (the first matching rule, else the default)."""
    chat_type, channel = derive_chat(key)
    derived = f"chatType={chat_type or 'none'} channel={channel or 'none'}"
    raw_lower = key.strip().lower()
    norm = normalize_session_key(key)
    index = next((i for i, rule in enumerate(scope.rules) if _rule_matches(
        rule, raw_lower=raw_lower, norm=norm, chat_type=chat_type, channel=channel)), None)
    if index is not None:
        allowed = scope.rules[index].action == "allow"
        reason = (f"allowed by rules[{index}] (allow); {derived}" if allowed else
                  f"denied by rules[{index}] (deny); {derived}; to allow it, change "
                  f"{SCOPE_KEY}.rules[{index}] or put an allow rule before it")
    else:
        allowed = scope.default == "allow"
        reason = (f"allowed by default (allow); {derived}" if allowed else
                  f"denied by default (deny); {derived}; to allow it, add "
                  f"{{action: \"allow\", match: {_match_for(chat_type, raw_lower)}}} to {SCOPE_KEY}.rules")
    return ScopeDecision(allowed=allowed, reason=reason, chat_type=chat_type, channel=channel,
                         session_key=key)


def _match_for(chat_type: str | None, raw_lower: str) -> str:
    """The ``match`` of an allow rule that covers this key: its chat type, or (a key with no
    chat type, such as a sub-agent's) its raw prefix up to the last ``:``."""
    if chat_type is not None:
        return f"{{chatType: \"{chat_type}\"}}"
    return f"{{rawKeyPrefix: \"{raw_lower.rsplit(':', 1)[0]}:\"}}"


def scope_candidates(session_key: str | None, inherited_keys: Sequence[str] = ()) -> list[str]:
    """The keys the rules are evaluated for: the session key, then each inherited key, trimmed,
    blanks dropped, repeats (compared case-insensitively) dropped, first seen kept."""
    seen: dict[str, str] = {}  # lower-cased -> as first seen
    for key in [session_key, *inherited_keys]:
        if trimmed := (key or "").strip():
            seen.setdefault(trimmed.lower(), trimmed)
    return list(seen.values())


def evaluate_scope(scope: QmdScope, session_key: str | None, *,
                   inherited_keys: Sequence[str] = ()) -> ScopeDecision:
    """Apply ``memory.qmd.scope`` to a session key and the keys it inherits (spec 2.12
    steps 3-4).

    The first rule whose every field matches decides (``channel`` and ``chatType``, ``dm``
    meaning ``direct``, against the derived values; ``rawKeyPrefix`` against the raw key;
    ``keyPrefix`` against the normalised key, or the raw one when it starts with ``agent:``);
    else ``scope.default``. The search is allowed when any key of :func:`scope_candidates` is:
    the raw ``session_key`` (``None`` or blank without inherited keys: an owner call) and the
    ``inherited_keys`` the session acts for (a sub-agent's parent, a thread's conversation).
    The decision's ``reason`` names the rule or default and the derived values (a denial says
    which rule to add; ``...; inherited from <key>`` when an inherited key decided).
    """
    candidates = scope_candidates(session_key, inherited_keys)
    if not candidates:
        return ScopeDecision(allowed=True, reason="owner call (no session key)",
                             session_key=None)
    raw = session_key if session_key is not None and session_key.strip() else None
    decisions = [_decide(scope, key) for key in candidates]
    first = decisions[0]
    allowing = next((d for d in decisions if d.allowed), None)
    if allowing is None or allowing is first and raw is not None:
        return first.model_copy(update={"session_key": raw})
    return allowing.model_copy(update={
        "reason": f"{allowing.reason}; inherited from {allowing.session_key}", "session_key": raw})
