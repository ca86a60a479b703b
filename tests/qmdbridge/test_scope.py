"""Tests for qmdbridge.policy.scope: key normalisation, chat derivation, scope rules, citations auto."""

from __future__ import annotations

import pytest

from qmdbridge.config import QmdScope, ScopeMatch, ScopeRule
from qmdbridge.policy.scope import citations_enabled, derive_chat, evaluate_scope, normalize_session_key


@pytest.mark.parametrize(("key", "expected"), [
    (None, None),
    ("   ", None),
    ("agent:main:main", "main"),
    ("  Agent:Main:Slack:DM:U123  ", "slack:dm:u123"),
    ("agent:main:subagent:5f2c", None),
    ("agent:ops:SubAgent:xyz", None),
    ("discord:channel:C1", "discord:channel:c1"),
    ("agent:main:signal:group:AbC+dEf=", "signal:group:AbC+dEf="),
    ("agent:main:matrix:channel:!RoomId:example.org", "matrix:channel:!RoomId:example.org"),
    ("agent:main", "agent:main"),
])
def test_normalize_session_key(key: str | None, expected: str | None) -> None:
    assert normalize_session_key(key) == expected


@pytest.mark.parametrize(("key", "expected"), [
    (None, (None, None)),
    ("agent:main:subagent:abc", (None, None)),
    ("agent:main:main", ("direct", None)),
    ("agent:main:slack:dm:u123", ("direct", "slack")),
    ("agent:main:slack:direct:u123", ("direct", "slack")),
    ("agent:main:discord:channel:c1", ("channel", "discord")),
    ("agent:main:telegram:group:-100123", ("group", "telegram")),
    ("agent:main:discord:channel:c1:thread:t9", ("channel", "discord")),
    ("agent:main:discord:group:g1:channel:c2", ("group", "discord")),
    ("agent:main:cli:memory-search", ("direct", None)),
    ("agent:main:whatsapp:acct:group:x", ("group", None)),
    ("agent:main:x:y:channel:z", ("channel", None)),
])
def test_derive_chat(key: str | None, expected: tuple[str | None, str | None]) -> None:
    assert derive_chat(key) == expected


def test_default_scope_allows_direct_only() -> None:
    scope = QmdScope()
    direct = evaluate_scope(scope, "agent:main:slack:dm:u123")
    assert direct.allowed is True
    assert direct.reason == "allowed by rules[0] (allow); chatType=direct channel=slack"
    assert evaluate_scope(scope, "agent:main:main").allowed is True
    group = evaluate_scope(scope, "agent:main:discord:group:g1")
    assert group.allowed is False
    assert group.reason == "denied by default (deny); chatType=group channel=discord"
    assert (group.chat_type, group.channel, group.session_key) == (
        "group", "discord", "agent:main:discord:group:g1")
    channel = evaluate_scope(scope, "agent:main:discord:channel:c1")
    assert channel.allowed is False
    assert channel.reason == "denied by default (deny); chatType=channel channel=discord"


def test_sub_agent_denied_by_default_scope() -> None:
    decision = evaluate_scope(QmdScope(), "agent:main:subagent:1234")
    assert decision.allowed is False
    assert decision.reason == "denied by default (deny); chatType=none channel=none"


def test_owner_call_allowed() -> None:
    for key in (None, "", "  "):
        decision = evaluate_scope(QmdScope(), key)
        assert decision.allowed is True
        assert decision.reason == "owner call (no session key)"
        assert (decision.chat_type, decision.channel, decision.session_key) == (None, None, None)


def test_no_scope_allows() -> None:
    decision = evaluate_scope(None, "agent:main:discord:group:g1")
    assert decision.allowed is True
    assert decision.reason == "no scope configured (allow)"


def test_case_42_channel_rule() -> None:
    scope = QmdScope.model_validate(
        {"default": "deny", "rules": [{"action": "allow", "match": {"channel": "slack"}}]})
    for key in ("agent:main:slack:channel:c123", "agent:main:slack:direct:u123",
                "agent:main:slack:dm:u123"):
        assert evaluate_scope(scope, key).allowed is True, key
    denied = evaluate_scope(scope, "agent:main:discord:channel:c123")
    assert denied.allowed is False
    assert denied.reason == "denied by default (deny); chatType=channel channel=discord"


def test_dm_alias_and_rule_order() -> None:
    scope = QmdScope(default="allow", rules=[
        ScopeRule(action="deny", match=ScopeMatch(chat_type="dm", channel="discord")),
        ScopeRule(action="allow", match=ScopeMatch(chat_type="dm")),
    ])
    first = evaluate_scope(scope, "agent:main:discord:direct:u1")
    assert (first.allowed, first.reason) == (
        False, "denied by rules[0] (deny); chatType=direct channel=discord")
    second = evaluate_scope(scope, "agent:main:telegram:dm:u1")
    assert (second.allowed, second.reason) == (
        True, "allowed by rules[1] (allow); chatType=direct channel=telegram")


def test_key_prefix_uses_normalised_key() -> None:
    scope = QmdScope(default="deny", rules=[
        ScopeRule(action="allow", match=ScopeMatch(key_prefix="Discord:Channel:")),
    ])
    assert evaluate_scope(scope, "agent:main:discord:channel:c1").allowed is True
    assert evaluate_scope(scope, "agent:ops:DISCORD:channel:c1").allowed is True
    assert evaluate_scope(scope, "agent:main:slack:channel:c1").allowed is False
    # sub-agent keys have no normalised key, so a keyPrefix never matches them
    assert evaluate_scope(scope, "agent:main:subagent:discord:channel:c1").allowed is False


def test_legacy_agent_key_prefix_compares_raw_key() -> None:
    scope = QmdScope(default="deny", rules=[
        ScopeRule(action="allow", match=ScopeMatch(key_prefix="agent:main:")),
    ])
    assert evaluate_scope(scope, "agent:main:discord:group:g1").allowed is True
    assert evaluate_scope(scope, "agent:main:subagent:x").allowed is True
    assert evaluate_scope(scope, "agent:ops:main").allowed is False


def test_raw_key_prefix() -> None:
    scope = QmdScope(default="deny", rules=[
        ScopeRule(action="allow", match=ScopeMatch(raw_key_prefix="AGENT:main:subagent:")),
    ])
    decision = evaluate_scope(scope, "agent:main:subagent:abc")
    assert (decision.allowed, decision.reason) == (
        True, "allowed by rules[0] (allow); chatType=none channel=none")
    assert evaluate_scope(scope, "agent:main:main").allowed is False


def test_rule_without_match_matches_everything() -> None:
    scope = QmdScope(default="allow", rules=[ScopeRule(action="deny")])
    assert evaluate_scope(scope, "agent:main:main").reason == (
        "denied by rules[0] (deny); chatType=direct channel=none")


@pytest.mark.parametrize(("mode", "key", "expected"), [
    ("on", "agent:main:discord:channel:c1", True),
    ("off", None, False),
    ("off", "agent:main:main", False),
    ("auto", None, True),
    ("auto", "agent:main:main", True),
    ("auto", "agent:main:slack:dm:u1", True),
    ("auto", "agent:main:discord:channel:c1", False),
    ("auto", "agent:main:telegram:group:-100", False),
    ("auto", "agent:main:subagent:abc", True),
    ("auto", "discord:channel:c1", False),
    ("bogus", "agent:main:main", True),
    ("bogus", "agent:main:telegram:group:1", False),
])
def test_citations_enabled(mode: str, key: str | None, expected: bool) -> None:
    assert citations_enabled(mode, key) is expected
