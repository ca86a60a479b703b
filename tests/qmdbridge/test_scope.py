"""Tests for qmdbridge.policy.scope: key normalisation, chat derivation, scope rules, citations auto."""

from __future__ import annotations

import pytest

from qmdbridge.config import QmdScope, ScopeMatch, ScopeRule
from qmdbridge.policy.citations import citations_enabled
from qmdbridge.policy.scope import (
    derive_chat,
    evaluate_scope,
    normalize_session_key,
    scope_candidates,
)


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
    assert group.reason == ("denied by default (deny); chatType=group channel=discord"
        '; to allow it, add {action: "allow", match: {chatType: "group"}} to memory.qmd.scope.rules')
    assert (group.chat_type, group.channel, group.session_key) == (
        "group", "discord", "agent:main:discord:group:g1")
    channel = evaluate_scope(scope, "agent:main:discord:channel:c1")
    assert channel.allowed is False
    assert channel.reason == ("denied by default (deny); chatType=channel channel=discord"
        '; to allow it, add {action: "allow", match: {chatType: "channel"}} to memory.qmd.scope.rules')


def test_sub_agent_denied_by_default_scope() -> None:
    decision = evaluate_scope(QmdScope(), "agent:main:subagent:1234")
    assert decision.allowed is False
    assert decision.reason == ("denied by default (deny); chatType=none channel=none"
        '; to allow it, add {action: "allow", match: {rawKeyPrefix: "agent:main:subagent:"}} to memory.qmd.scope.rules')


def test_owner_call_allowed() -> None:
    for key in (None, "", "  "):
        decision = evaluate_scope(QmdScope(), key)
        assert decision.allowed is True
        assert decision.reason == "owner call (no session key)"
        assert (decision.chat_type, decision.channel, decision.session_key) == (None, None, None)


def test_case_42_channel_rule() -> None:
    scope = QmdScope.model_validate(
        {"default": "deny", "rules": [{"action": "allow", "match": {"channel": "slack"}}]})
    for key in ("agent:main:slack:channel:c123", "agent:main:slack:direct:u123",
                "agent:main:slack:dm:u123"):
        assert evaluate_scope(scope, key).allowed is True, key
    denied = evaluate_scope(scope, "agent:main:discord:channel:c123")
    assert denied.allowed is False
    assert denied.reason == ("denied by default (deny); chatType=channel channel=discord"
        '; to allow it, add {action: "allow", match: {chatType: "channel"}} to memory.qmd.scope.rules')


def test_dm_alias_and_rule_order() -> None:
    scope = QmdScope(default="allow", rules=[
        ScopeRule(action="deny", match=ScopeMatch(chat_type="dm", channel="discord")),
        ScopeRule(action="allow", match=ScopeMatch(chat_type="dm")),
    ])
    first = evaluate_scope(scope, "agent:main:discord:direct:u1")
    assert (first.allowed, first.reason) == (
        False, ("denied by rules[0] (deny); chatType=direct channel=discord"
        "; to allow it, change memory.qmd.scope.rules[0] or put an allow rule before it"))
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
        "denied by rules[0] (deny); chatType=direct channel=none"
        "; to allow it, change memory.qmd.scope.rules[0] or put an allow rule before it")


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


# Every session key shape OpenClaw documents (docs/concepts/session: dmScope main, per-peer,
# per-channel-peer, per-account-channel-peer; groups, channels, threads, Telegram topics, cron,
# webhooks, nodes, ACP and sub-agent runs), derived as the reference's qmd scope derives them,
# and the default scope's verdict (deny, allow direct chats).
@pytest.mark.parametrize(("key", "chat", "allowed"), [
    ("agent:main:main", ("direct", None), True),
    ("agent:main:dm:u123", ("direct", None), True),
    ("agent:main:telegram:dm:u123", ("direct", "telegram"), True),
    ("agent:main:telegram:work-bot:dm:u123", ("direct", None), True),
    ("agent:main:whatsapp:group:120363@g.us", ("group", "whatsapp"), False),
    ("agent:main:discord:channel:c1", ("channel", "discord"), False),
    ("agent:main:discord:channel:c1:thread:t9", ("channel", "discord"), False),
    ("agent:main:telegram:group:-100123:topic:77", ("group", "telegram"), False),
    ("agent:main:cron:nightly:run:r42", ("direct", None), True),
    ("cron:nightly", ("direct", None), True),
    ("hook:2f0c6b1e", ("direct", None), True),
    ("node-kitchen-pi", ("direct", None), True),
    ("agent:main:acp:7f3c", ("direct", None), True),
    ("agent:main:subagent:7f3c", (None, None), False),
    ("subagent:7f3c", (None, None), False),
    # empty segments are skipped by the reference's parser
    ("agent::main:discord:channel:c1", ("channel", "discord"), False),
    ("agent:main:slack::dm:u1", ("direct", "slack"), True),
    ("agent:main::subagent:7f3c", (None, None), False),
])
def test_documented_key_shapes(key: str, chat: tuple[str | None, str | None], allowed: bool) -> None:
    assert derive_chat(key) == chat
    assert evaluate_scope(QmdScope(), key).allowed is allowed


def test_empty_segments_match_channel_rules_as_in_the_reference() -> None:
    """`agent::main:...` and `slack::dm` were read with an empty part: no channel derived, so a
    channel rule the reference applies did not match and the default denied the search."""
    scope = QmdScope.model_validate(
        {"default": "deny", "rules": [{"action": "allow", "match": {"channel": "discord"}},
                                      {"action": "allow", "match": {"keyPrefix": "slack:dm:"}}]})
    a = evaluate_scope(scope, "agent::main:discord:channel:c1")
    assert (a.allowed, a.reason) == (True, "allowed by rules[0] (allow); chatType=channel channel=discord")
    b = evaluate_scope(scope, "agent:main:slack::dm:u1")
    assert (b.allowed, b.reason) == (True, "allowed by rules[1] (allow); chatType=direct channel=slack")
    assert normalize_session_key("agent:main:slack::dm:U1") == "slack:dm:u1"


def test_sub_agent_is_allowed_through_the_session_that_spawned_it() -> None:
    """The reference evaluates the rules for every key a session inherits: a sub-agent spawned
    from a direct chat may search, one spawned from a group may not."""
    from_dm = evaluate_scope(QmdScope(), "agent:main:subagent:7f3c", inherited_keys=["agent:main:main"])
    assert (from_dm.allowed, from_dm.reason, from_dm.chat_type, from_dm.session_key) == (
        True, "allowed by rules[0] (allow); chatType=direct channel=none; inherited from agent:main:main",
        "direct", "agent:main:subagent:7f3c")
    from_group = evaluate_scope(QmdScope(), "agent:main:subagent:7f3c",
                                inherited_keys=["agent:main:telegram:group:-100123"])
    assert (from_group.allowed, from_group.reason, from_group.chat_type) == (
        False, ("denied by default (deny); chatType=none channel=none"
        '; to allow it, add {action: "allow", match: {rawKeyPrefix: "agent:main:subagent:"}} to memory.qmd.scope.rules'), None)


def test_any_allowed_candidate_wins_and_candidates_are_deduplicated() -> None:
    scope = QmdScope.model_validate({"default": "deny", "rules": [
        {"action": "deny", "match": {"keyPrefix": "telegram:group:-100555"}},
        {"action": "allow", "match": {"keyPrefix": "telegram:group:-100444:topic:12"}}]})
    decision = evaluate_scope(scope, "agent:main:telegram:group:-100555",
                              inherited_keys=["agent:main:telegram:group:-100444:topic:12"])
    assert (decision.allowed, decision.reason) == (
        True, "allowed by rules[1] (allow); chatType=group channel=telegram; inherited from "
              "agent:main:telegram:group:-100444:topic:12")
    assert scope_candidates(" Agent:Main:Telegram:Group:-1:Topic:9 ", [
        "agent:main:telegram:group:-1:topic:9", "AGENT:MAIN:TELEGRAM:GROUP:-1", "", "  ",
        "agent:main:telegram:group:-1"]) == ["Agent:Main:Telegram:Group:-1:Topic:9",
                                             "AGENT:MAIN:TELEGRAM:GROUP:-1"]
    # only inherited keys (no session key of its own): evaluated like any other key
    only = evaluate_scope(QmdScope(), None, inherited_keys=["agent:main:main"])
    assert (only.allowed, only.reason, only.session_key) == (
        True, "allowed by rules[0] (allow); chatType=direct channel=none; inherited from agent:main:main", None)
