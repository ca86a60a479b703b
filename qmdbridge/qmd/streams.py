"""A child's output as the runner keeps it: UTF-8 with replacement, the last ``max_chars`` code points.

Standard library only: the runner (``qmdbridge/qmd/runner.py``) and the qmd calls a one-shot
search starts before anything heavy is loaded (``qmdbridge/qmd/early.py``) decode alike.
"""

from __future__ import annotations

import codecs

__all__ = ["DEFAULT_MAX_CHARS", "TailBuffer", "split_status"]

# Per-stream cap in characters, as in the reference runner; the buffers keep the tail.
DEFAULT_MAX_CHARS = 200_000


class TailBuffer:
    """Incremental UTF-8 decoder (invalid bytes replaced) that keeps the last ``max_chars`` code
    points.

    Args:
        max_chars: the cap in code points, > 0.
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False  # more than max_chars were fed (the head was dropped)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, *, final: bool = False) -> None:
        """Decode ``data`` (``final``: the stream ended, flush a partial character)."""
        text = self.decoder.decode(data, final)
        if not text:
            return
        self.parts.append(text)
        self.size += len(text)
        if self.size > 2 * self.max_chars:
            self._compact()

    def _compact(self) -> None:
        joined = "".join(self.parts)
        if len(joined) > self.max_chars:
            self.truncated = True
            joined = joined[-self.max_chars:]
        self.parts = [joined]
        self.size = len(joined)

    def text(self) -> str:
        """The decoded tail, at most ``max_chars`` code points."""
        self._compact()
        return self.parts[0] if self.parts else ""


def split_status(code: int | None) -> tuple[int | None, int | None]:
    """``(returncode, signal)`` of a ``Popen.returncode``: a negative code is the signal that
    ended the process (``-9`` -> ``(None, 9)``)."""
    if code is not None and code < 0:
        return None, -code
    return code, None
