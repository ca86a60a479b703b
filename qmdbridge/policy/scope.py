"""Scope rules: which session keys may search memory, and whether citations are shown.

Implements the reference system's scope rules (session-key normalisation, chat-type and channel
derivation, ordered allow/deny rules) and its ``auto`` citations mode, with two decisions of
ours:

- no session key (a direct library or CLI call) is an owner call: always allowed, and
  ``auto`` citations are on for it;
- a denial is returned as a :class:`~fallback.models.ScopeDecision` whose ``reason`` names
  the rule (``rules[<i>]``) or the default, with the derived chat type and channel, e.g.
  ``denied by default (deny); chatType=group channel=discord``.

Session keys look like ``agent:<agentId>:<rest>``, where ``<rest>`` is e.g. ``main``,
``slack:dm:u123``, ``discord:channel:c1``, ``telegram:group:-100123`` or
``subagent:<uuid>``.
"""

from __future__ import annotations

import re

from fallback.models import ScopeDecision
from qmdbridge.config import QmdScope, ScopeRule

__all__ = ["citations_enabled", "derive_chat", "evaluate_scope", "normalize_session_key"]

_AGENT_PREFIX = re.compile(r"^agent:[^:]+:(.+)$", re.I | re.S)
_CHAT_MARKERS = ("group", "channel", "direct", "dm")
# Channels whose ids are opaque and case-sensitive (Signal group ids are base64, Matrix room
# ids like ``!AbC:server``): only the channel and kind parts are lower-cased.
_CASE_SENSITIVE_ID_CHANNELS = ("signal", "matrix")


def _rest_of(key: str) -> str:
    match = _AGENT_PREFIX.match(key)
    return match.group(1) if match else key


def normalize_session_key(key: str | None) -> str | None:
    """Normalise a session key for scope matching (spec 2.12 step 1).

    Trim; strip a leading ``agent:<id>:`` (case-insensitive); lower-case (for ``signal`` and
    ``matrix`` keys with an id part, only the first two parts, so opaque ids keep their case).

    Args:
        key: the raw session key, or ``None``.

    Returns:
        The normalised key; ``None`` for a missing or blank key and for sub-agent keys
        (rest starting with ``subagent:``), which have no normalised form.
    """
    if key is None:
        return None
    trimmed = key.strip()
    if not trimmed:
        return None
    rest = _rest_of(trimmed)
    if rest.lower().startswith("subagent:"):
        return None
    parts = rest.split(":")
    if len(parts) >= 3 and parts[0].lower() in _CASE_SENSITIVE_ID_CHANNELS:
        return ":".join([parts[0].lower(), parts[1].lower(), *parts[2:]])
    return rest.lower()


def derive_chat(key: str | None) -> tuple[str | None, str | None]:
    """Derive ``(chat_type, channel)`` from a session key (spec 2.12 step 2).

    On the normalised key: when its second ``:``-part is ``group``, ``channel``, ``direct`` or
    ``dm``, the channel is the first part and the chat type is ``group`` if any part is
    ``group``, else ``channel`` if any part is ``channel``, else ``direct``. Otherwise the
    chat type is ``group`` if the key contains ``:group:``, ``channel`` if it contains
    ``:channel:``, else ``direct``, with no channel.

    Args:
        key: the raw session key, or ``None``.

    Returns:
        ``(chat_type, channel)``; ``(None, None)`` when there is no normalised key (missing
        key, sub-agent key). ``chat_type`` is ``direct`` | ``group`` | ``channel``.
    """
    norm = normalize_session_key(key)
    if norm is None:
        return None, None
    parts = norm.split(":")
    if len(parts) >= 2 and parts[1] in _CHAT_MARKERS:
        lowered = [p.lower() for p in parts]
        if "group" in lowered:
            chat_type = "group"
        elif "channel" in lowered:
            chat_type = "channel"
        else:
            chat_type = "direct"
        return chat_type, parts[0] or None
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
    if match.chat_type is not None:
        wanted = "direct" if match.chat_type == "dm" else match.chat_type
        if chat_type != wanted:
            return False
    if match.raw_key_prefix is not None and not raw_lower.startswith(
            match.raw_key_prefix.strip().lower()):
        return False
    if match.key_prefix is not None:
        prefix = match.key_prefix.strip().lower()
        if prefix.startswith("agent:"):
            # Legacy configs wrote agent-qualified prefixes: compare with the raw key.
            if not raw_lower.startswith(prefix):
                return False
        elif norm is None or not norm.lower().startswith(prefix):
            return False
    return True


def evaluate_scope(scope: QmdScope | None, session_key: str | None) -> ScopeDecision:
    """Apply ``memory.qmd.scope`` to one session key (spec 2.12 step 3-4, DESIGN decisions).

    Rules are tried in order; a rule matches when every field it gives matches: ``channel``
    equals the derived channel; ``chatType`` equals the derived chat type (``dm`` means
    ``direct``); ``rawKeyPrefix`` (lower-cased) prefixes the raw lower-cased key;
    ``keyPrefix`` (lower-cased) prefixes the normalised key, except that a ``keyPrefix``
    starting with ``agent:`` is compared with the raw key (legacy). The first match decides;
    no match falls to ``scope.default``.

    Args:
        scope: the configured scope; ``None`` (no scope object) allows everything.
        session_key: the raw key; ``None`` or blank is an owner call and is allowed.

    Returns:
        :class:`ScopeDecision` with ``allowed``, ``reason`` (``allowed by rules[0] (allow);
        chatType=direct channel=slack``, ``denied by default (deny); chatType=group
        channel=discord``, ``owner call (no session key)``), ``chat_type``, ``channel`` and
        the raw ``session_key``.
    """
    if session_key is None or not session_key.strip():
        return ScopeDecision(allowed=True, reason="owner call (no session key)",
                             session_key=None)
    chat_type, channel = derive_chat(session_key)
    if scope is None:
        return ScopeDecision(allowed=True, reason="no scope configured (allow)",
                             chat_type=chat_type, channel=channel, session_key=session_key)
    derived = f"chatType={chat_type or 'none'} channel={channel or 'none'}"
    raw_lower = session_key.strip().lower()
    norm = normalize_session_key(session_key)
    for index, rule in enumerate(scope.rules):
        if _rule_matches(rule, raw_lower=raw_lower, norm=norm, chat_type=chat_type,
                         channel=channel):
            allowed = rule.action == "allow"
            verdict = "allowed" if allowed else "denied"
            return ScopeDecision(allowed=allowed,
                                 reason=f"{verdict} by rules[{index}] ({rule.action}); {derived}",
                                 chat_type=chat_type, channel=channel, session_key=session_key)
    allowed = scope.default == "allow"
    verdict = "allowed" if allowed else "denied"
    return ScopeDecision(allowed=allowed, reason=f"{verdict} by default ({scope.default}); {derived}",
                         chat_type=chat_type, channel=channel, session_key=session_key)


def citations_enabled(mode: str, session_key: str | None) -> bool:
    """Decide whether hits carry citations and the ``Source:`` footer (spec 2.13, DESIGN).

    ``on`` -> True; ``off`` -> False; ``auto`` (and any invalid mode, which reads as ``auto``)
    -> True for owner calls (no key) and direct chats, False for groups and channels. The chat
    is a group or channel when the lower-cased ``:``-tokens of the key's rest (after
    ``agent:<id>:``) contain ``group`` or ``channel``. Divergence from the reference, which
    counts keys without the agent prefix as direct: the same token test is applied to the
    whole key, so ``discord:channel:c1`` is a channel here too.

    Args:
        mode: ``memory.citations``: ``auto`` | ``on`` | ``off``.
        session_key: the raw session key, or ``None``.
    """
    if mode == "on":
        return True
    if mode == "off":
        return False
    if session_key is None or not session_key.strip():
        return True
    tokens = [t.lower() for t in _rest_of(session_key.strip()).split(":")]
    return "channel" not in tokens and "group" not in tokens
