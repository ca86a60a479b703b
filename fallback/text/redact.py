"""Secret redaction: replace credentials in free text with ``[REDACTED:<kind>]`` markers.

Used on session transcripts before they are indexed or exported, so a key pasted into a chat
never becomes searchable memory. Only credentials by shape or by an explicit label are
redacted, not what merely looks random (commit ids, UUIDs).
"""

from __future__ import annotations

import re

__all__ = ["redact_secrets"]

# A token character class shared by the shape rules; the look-behind keeps a rule from
# starting in the middle of a longer word (``mask-xyz`` must not read as ``sk-xyz``).
_B = r"(?<![A-Za-z0-9_\-])"
_E = r"(?![A-Za-z0-9_\-])"

_PEM = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----[\s\S]*?-----END \1PRIVATE KEY-----")
# scheme://user:pass@host -> keep scheme, user and host (a bounded scheme keeps the scan linear).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]{0,31}://[^\s:/@]+:)([^\s@/]+)(@)")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+)"
                          r"(?!\[REDACTED)([^\s\"',;]+)")
# Bearer tokens outside a header only from 16 chars on, so "Bearer of bad news" stays.
_BEARER = re.compile(r"\b(Bearer\s+)([A-Za-z0-9._~+/=\-]{16,})")

_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("anthropic_key", re.compile(_B + r"sk-ant-[A-Za-z0-9_\-]{20,}" + _E)),
    ("openai_key", re.compile(_B + r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}" + _E)),
    ("stripe_key", re.compile(_B + r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}" + _E)),
    ("google_api_key", re.compile(_B + r"AIza[0-9A-Za-z_\-]{35}" + _E)),
    ("github_token", re.compile(_B + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"
                                + _E)),
    ("slack_token", re.compile(_B + r"xox[abprs]-[A-Za-z0-9\-]{10,}" + _E)),
    ("aws_access_key_id", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")),
    ("jwt", re.compile(_B + r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}" + _E)),
)

_AWS_SECRET = re.compile(
    r"(?i)\b(aws_secret(?:_access)?_key[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9/+=]{30,})")

# The label of a labelled assignment: a name whose last word says it holds a credential, alone
# or ending a compound ("DB_PASSWORD=", "GITHUB_TOKEN=", "X-Api-Key:", "--api-key=").
_LABEL = (r"(?:[A-Za-z0-9]+[_\-.])*(?:[A-Za-z0-9]*pass(?:word|wd|phrase)|secret|token"
          r"|api[_\-]?key|(?:secret|private|signing|encryption|master|client)[_\-]key)")
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-.])(?:--?)?(?P<label>" + _LABEL
    + r")(?P<sep>[\"']?[ \t]*(?P<op>[:=])[ \t]*)"
    r"(?:(?P<q>[\"'])(?!\[REDACTED)(?P<quoted>[^\"'\n]+)(?P=q)|(?!\[REDACTED)(?P<bare>[^\s\"',;]+))")


def _label_kind(label: str) -> str:
    """The kind a credential label names by its last word: ``password``, ``token``,
    ``api_key`` or ``secret``."""
    low = label.lower()
    if "pass" in re.split(r"[_\-.]", low)[-1]:
        return "password"
    if low.endswith("token"):
        return "token"
    if re.search(r"(?:^|[_\-.])api[_\-]?key$", low):
        return "api_key"
    return "secret"


def _looks_like_value(value: str, separator: str) -> bool:
    """Whether the bare value after ``label=`` (always) or ``label:`` (not prose: 4+ chars
    with a digit or symbol, or 12+ chars) is a credential."""
    return separator == "=" or len(value) >= 12 or (len(value) >= 4 and not value.isalpha())


def _assignment(match: re.Match[str]) -> str:
    label, sep_text, op = match.group("label", "sep", "op")
    head = match.group(0)[: match.start("label") - match.start()]  # a flag's leading dashes
    kind = _label_kind(label)
    quote = match.group("q")
    if quote is not None:
        return f"{head}{label}{sep_text}{quote}[REDACTED:{kind}]{quote}"
    if not _looks_like_value(match.group("bare"), op):
        return match.group(0)
    return f"{head}{label}{sep_text}[REDACTED:{kind}]"


def redact_secrets(text: str) -> str:
    """Return ``text`` with every recognised secret replaced by ``[REDACTED:<kind>]``
    (idempotent): PEM private keys, URL passwords, ``Authorization``/``Bearer`` tokens, vendor
    key shapes (Anthropic, OpenAI, Stripe, Google, GitHub, Slack, AWS), JWTs, and labelled
    assignments (the label and separator kept).

    Source: the vendors' published credential formats and the gitleaks rule set.
    """
    if not text:
        return text
    out = _PEM.sub("[REDACTED:private_key]", text)
    out = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}[REDACTED:password]{m.group(3)}", out)
    out = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}[REDACTED:bearer_token]", out)
    out = _BEARER.sub(lambda m: f"{m.group(1)}[REDACTED:bearer_token]", out)
    for kind, pattern in _SHAPES:
        out = pattern.sub(f"[REDACTED:{kind}]", out)
    out = _AWS_SECRET.sub(lambda m: f"{m.group(1)}[REDACTED:aws_secret_access_key]", out)
    out = _ASSIGNMENT.sub(_assignment, out)
    return out
