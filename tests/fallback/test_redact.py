"""Tests for fallback.text.redact: every secret kind is redacted, look-alikes are left alone."""

from __future__ import annotations

import pytest

from fallback.text.redact import redact_secrets

OPENAI = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
OPENAI_PROJ = "sk-proj-" + "Zz9_Yy8-Xx7Ww6Vv5Uu4Tt3Ss2"
ANTHROPIC = "sk-ant-api03-" + "abcDEF123ghiJKL456mnoPQR789"
GOOGLE = "AIza" + "SyA1234567890abcdefghijklmnopqrstuv"
GITHUB = "ghp_" + "a" * 18 + "B" * 18
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
SLACK = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_RK = "rk_live_" + "51HbQwEJk3LmNoPqRsTuVwXy"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")


@pytest.mark.parametrize(("text", "expected"), [
    (f"my key is {OPENAI} ok", "my key is [REDACTED:openai_key] ok"),
    (f"OPENAI_API_KEY={OPENAI_PROJ}", "OPENAI_API_KEY=[REDACTED:openai_key]"),
    (f"use {ANTHROPIC}", "use [REDACTED:anthropic_key]"),
    (f"maps key {GOOGLE}.", "maps key [REDACTED:google_api_key]."),
    (f"gh: {GITHUB}", "gh: [REDACTED:github_token]"),
    (f"token {GITHUB_PAT}", "token [REDACTED:github_token]"),
    (f"slack {SLACK}", "slack [REDACTED:slack_token]"),
    (f"stripe {STRIPE} and {STRIPE_RK}", "stripe [REDACTED:stripe_key] and [REDACTED:stripe_key]"),
    ("id AKIAIOSFODNN7EXAMPLE here", "id [REDACTED:aws_access_key_id] here"),
    ("temp ASIAY34FZKBOKMUTVV7A", "temp [REDACTED:aws_access_key_id]"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     "aws_secret_access_key = [REDACTED:aws_secret_access_key]"),
    ("Authorization: Bearer abc", "Authorization: Bearer [REDACTED:bearer_token]"),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNz'",
     "curl -H 'Authorization: Basic [REDACTED:bearer_token]'"),
    ("send Bearer 0123456789abcdefXYZ please", "send Bearer [REDACTED:bearer_token] please"),
    ("postgres://admin:hunter2@db.internal:5432/app",
     "postgres://admin:[REDACTED:password]@db.internal:5432/app"),
    ("password=hunter2", "password=[REDACTED:password]"),
    ("passwd: s3cret!", "passwd: [REDACTED:password]"),
    ("secret=abc", "secret=[REDACTED:secret]"),
    ("api_key = 'k-12345'", "api_key = '[REDACTED:api_key]'"),
    ("token=deadbeefcafe", "token=[REDACTED:token]"),
    ('{"password": "p@ss w0rd", "user": "bob"}', '{"password": "[REDACTED:password]", "user": "bob"}'),
    ("client_secret: 'abc'", "client_secret: '[REDACTED:secret]'"),
    # compound names, as environment variables, config keys and flags write them
    ("DB_PASSWORD=hunter2x PGPASSWORD=pg1", "DB_PASSWORD=[REDACTED:password] PGPASSWORD=[REDACTED:password]"),
    ("export GITHUB_TOKEN=abc123def456", "export GITHUB_TOKEN=[REDACTED:token]"),
    ("MY_API_KEY=abcd1234efgh", "MY_API_KEY=[REDACTED:api_key]"),
    ("X-Api-Key: abcd1234efgh5678", "X-Api-Key: [REDACTED:api_key]"),
    ("SECRET_KEY=abcdef123456 STRIPE_SIGNING_SECRET=whsec1",
     "SECRET_KEY=[REDACTED:secret] STRIPE_SIGNING_SECRET=[REDACTED:secret]"),
    ("client-secret: zzz9yyy8", "client-secret: [REDACTED:secret]"),
    ("mysql -u root --password=s3cr3t", "mysql -u root --password=[REDACTED:password]"),
    ("db.password=hunter2", "db.password=[REDACTED:password]"),
    (f"jwt {JWT} end", "jwt [REDACTED:jwt] end"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY----- after",
     "[REDACTED:private_key] after"),
    ("-----BEGIN PRIVATE KEY----- MIIEv QIBAD -----END PRIVATE KEY-----", "[REDACTED:private_key]"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----",
     "[REDACTED:private_key]"),
])
def test_redacts_each_kind(text: str, expected: str) -> None:
    assert redact_secrets(text) == expected


@pytest.mark.parametrize("text", [
    "Fixed in commit 3f786850e387550fdab836ed7e6dc881de23001b and 3f78685.",
    "Session 550e8400-e29b-41d4-a716-446655440000 started",
    "I forgot my password yesterday and had to reset the token.",
    "The token budget is large; the password policy changed.",
    "the token: we rotate it monthly",
    "See /home/user/.ssh/config and C:\\Users\\bob\\notes.md",
    "Docs at https://example.com:8080/path?q=1 and https://github.com/openai/tiktoken",
    "Short words like aGVsbG8 and dGVzdA== stay",
    "Bearer of bad news",
    "Run with PWD=/home/user/project",
    "max_tokens=500 and tokens: 4000",
    "token_count=5 sort_key=name passport: X1234567 bypass=on",
    "the api key: we keep it safe",
    "ask-me-anything is not a key; task-abcdefghijklmnopqrstuvwxyz neither",
    "AKIA is a prefix; AKIAshort too",
    "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----",
    "",
])
def test_leaves_lookalikes_alone(text: str) -> None:
    assert redact_secrets(text) == text


def test_idempotent() -> None:
    once = redact_secrets(f"password={OPENAI} Authorization: Bearer {OPENAI}")
    assert once == "password=[REDACTED:openai_key] Authorization: Bearer [REDACTED:bearer_token]"
    assert redact_secrets(once) == once


@pytest.mark.timeout(60)  # a hang guard: linear is about 0.1 s, quadratic minutes
@pytest.mark.parametrize("run", ["a.", "x-", "v1.2-"])
def test_a_long_run_without_spaces_is_redacted_in_linear_time(run: str) -> None:
    """A pasted line of 200,000 characters of letters, dots and hyphens (a minified file, a
    long slug) is not a URL: each place it could start a scheme is given up after a scheme's
    length, not after scanning the rest of the line (that took 140 s, the sync stalled)."""
    text = run * (200_000 // len(run)) + "=x"
    assert redact_secrets(text) == text
