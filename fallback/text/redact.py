"""Secret redaction: replace credentials in free text with ``[REDACTED:<kind>]`` markers.

Used on session transcripts before they are indexed (builtin engine) or exported for qmd, so a
key pasted into a chat never becomes searchable memory. The rules aim at things that are
credentials by their shape or by an explicit label; they leave alone what merely looks random
(git commit ids, UUIDs, short base64-ish words), file paths, URLs without a password, and
prose that mentions "password" or "token" without giving one.

Kinds: ``private_key``, ``password``, ``bearer_token``, ``anthropic_key``, ``openai_key``,
``stripe_key``, ``google_api_key``, ``github_token``, ``slack_token``, ``aws_access_key_id``,
``aws_secret_access_key``, ``jwt``, ``secret``, ``api_key``, ``token``.
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
# scheme://user:pass@host -> keep scheme, user and host. The scheme is at most 32 characters
# (real ones are short): unbounded, each word start of a long run of letters, dots and hyphens
# scanned to its end, quadratic (docs/benchmarks.md, "Costs behind constants").
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

# The label of a labelled assignment ("password=hunter2", "api_key: abc123", JSON keys): a
# name whose last word says it holds a credential, alone or ending a compound name as
# environment variables and flags write them ("DB_PASSWORD=", "PGPASSWORD=", "GITHUB_TOKEN=",
# "STRIPE_SIGNING_SECRET=", "X-Api-Key:", "--api-key="). Its last word decides the kind.
_LABEL = (r"(?:[A-Za-z0-9]+[_\-.])*(?:[A-Za-z0-9]*pass(?:word|wd|phrase)|secret|token"
          r"|api[_\-]?key|(?:secret|private|signing|encryption|master|client)[_\-]key)")
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-.])(?:--?)?(?P<label>" + _LABEL
    + r")(?P<sep>[\"']?[ \t]*(?P<op>[:=])[ \t]*)"
    r"(?:(?P<q>[\"'])(?!\[REDACTED)(?P<quoted>[^\"'\n]+)(?P=q)|(?!\[REDACTED)(?P<bare>[^\s\"',;]+))")


def _label_kind(label: str) -> str:
    """The kind a credential label names, by its last word: ``password``, ``token``,
    ``api_key`` or ``secret`` (``client_secret``, ``SECRET_KEY``, ``PRIVATE_KEY`` ...)."""
    low = label.lower()
    if "pass" in re.split(r"[_\-.]", low)[-1]:
        return "password"
    if low.endswith("token"):
        return "token"
    if re.search(r"(?:^|[_\-.])api[_\-]?key$", low):
        return "api_key"
    return "secret"


def _looks_like_value(value: str, separator: str) -> bool:
    """Decide whether the text after ``label:``/``label=`` is a credential.

    ``=`` is an assignment, so any value counts. After ``:`` the next word may be prose
    ("the token: we rotate it monthly"), so the value must contain a digit or a symbol and
    be at least 4 chars long, or be at least 12 chars long. Quoted values always count.
    """
    if separator == "=":
        return True
    if len(value) >= 12:
        return True
    return any(not ch.isalpha() for ch in value) and len(value) >= 4


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
    """Return ``text`` with every recognised secret replaced by ``[REDACTED:<kind>]``.

    Recognised (see the module docstring for the kinds): PEM private key blocks; passwords in
    URLs (``scheme://user:pass@host`` keeps ``user`` and the host); ``Authorization:`` header
    values and ``Bearer <token>`` with a token of >= 16 chars; Anthropic (``sk-ant-``),
    OpenAI (``sk-``, ``sk-proj-``; >= 20 chars after the prefix), Stripe (``sk_live_``,
    ``rk_live_``, ``*_test_``), Google (``AIza`` + 35), GitHub (``ghp_``/``gho_``/``ghs_``/
    ``ghu_``/``ghr_`` + >= 30, ``github_pat_``), Slack (``xox[abprs]-``) keys; AWS access key
    ids (``AKIA``/``ASIA`` + 16 upper-case alphanumerics) and labelled AWS secret keys; JWTs
    (``eyJ...`` three dot-separated base64url parts of >= 8 chars each); labelled assignments
    with ``=`` or ``:`` and a value (the label and separator are kept), the label a name whose
    last word is ``password``/``passwd``/``passphrase``/``secret``/``token``/``api_key`` or a
    secret, private, signing, encryption, master or client key, alone or ending a compound
    name as environment variables and flags write them (``DB_PASSWORD=``, ``PGPASSWORD=``,
    ``GITHUB_TOKEN=``, ``X-Api-Key:``, ``--api-key=``; not ``max_tokens=``).

    Args:
        text: any text (a transcript message, possibly multi-line).

    Returns:
        The redacted text; unchanged when nothing matched. Idempotent: markers are never
        redacted again.

    Source: patterns modelled on the credential formats published by each vendor and on
    common secret scanners (gitleaks rule set); thresholds chosen to spare commit ids and UUIDs.
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
