"""Benchmark the text helpers: chunk weights and CJK tests, cutting long lines, memory_get pages.

``text_weight`` runs on every line the builtin engine indexes, ``contains_cjk`` on every chunk
(trigram table) and query token, ``mmr_tokens`` on every snippet MMR compares, and
``extract_keywords`` on every keyword-fallback query. The text is deterministic: Markdown lines
drawn from English notes and Japanese, Chinese and Korean lines (about 20 % of the lines CJK),
repeated up to ``--mb`` megabytes of UTF-8. Each timing is the best of ``--repeat`` runs over
all lines, in CPU time of this process (the helpers are single-threaded and CPU-bound, so
other load on a shared machine does not count). The ``checksum`` rows (total weight, CJK line count) let two runs be compared for
equal results as well as speed.

The ``long line`` section chunks one line of 6,000 generated words (a pasted log, or prose
without line breaks) and counts the words no chunk holds whole (the floor is 0). The
``memory_get`` section pages generated notes with ``read_memory_page``: a 60,000-line note (read
whole) with ``lines`` 120 and 60,000, and a 1,000,000-line note (above the streaming threshold)
from its first line and from line 999,000, each with ``lines`` as large as the note; a page must
cost what it returns, so each of these has a floor of 200 ms (best of ``--repeat`` runs, wall
time: the read is part of the cost).

Usage: python3 scripts/bench_text.py [--mb 2] [--repeat 5] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Row, check, emit  # noqa: E402

from fallback.search.ranking import mmr_tokens  # noqa: E402
from fallback.sources.read_page import read_memory_page  # noqa: E402
from fallback.text.chunking import chunk_markdown  # noqa: E402
from fallback.text.keywords import extract_keywords  # noqa: E402
from fallback.text.scripts import contains_cjk, text_weight  # noqa: E402

ENGLISH = (
    "- Dana reviewed the nightly revenue report before lunch.",
    "Priya migrated the webhook timeout with a rollback path, as agreed on Tuesday.",
    "## Ops log",
    "Kenji rebooted the NAS at 02:00 and wrote it down; the backup job resumed.",
    "The search index rebuild took 41 s on the staging cluster (café, naïve, l·l).",
)
CJK = (
    "渡辺さんと東京チームのデータ連携について打ち合わせ。Parquetで受け渡し。",
    "今天和团队讨论了数据库迁移的计划，下周开始执行。",
    "오늘 회의는 취소되었습니다. 다음 주에 다시 일정을 잡겠습니다.",
    "路由器重启以后网络恢复正常。",
    "バックアップの容量が不足している。古いスナップショットを削除。",
)
QUERIES = ("what did Priya migrate", "東京チームのデータ連携", "数据库迁移的计划", "회의는 언제",
           "backup job 02:00")
CJK_SHARE = 0.2
# A memory_get page must cost what it returns, whatever the note's length or ``lines`` says.
PAGE_FLOOR_MS = 200.0


def mixed_lines(total_bytes: int, *, seed: int = 7) -> list[str]:
    """Deterministic Markdown lines (about ``CJK_SHARE`` of them CJK) totalling ``total_bytes`` of UTF-8."""
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < total_bytes:
        line = rng.choice(CJK) if rng.random() < CJK_SHARE else rng.choice(ENGLISH)
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return lines


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in ms of CPU time."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, (time.process_time() - start) * 1000)
    return best


def best_wall_ms(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in ms of wall time."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - start) * 1000)
    return best


def long_line_rows(repeat: int) -> list[Row]:
    """Chunk one line of 6,000 words; time it and count the words no chunk holds whole."""
    rng = random.Random(11)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 12)))
             for _ in range(6000)]
    line = " ".join(words)
    section = f"long line ({len(line) // 1000} KB, {len(words)} words, no line break)"
    chunks = chunk_markdown(line)
    held = set().union(*(set(re.findall(r"\w+", c.text)) for c in chunks))
    lost = len(set(words) - held)
    return [
        Row(section, "chunk_markdown of the line", best_ms(lambda: chunk_markdown(line), repeat),
            "ms", note=f"{len(chunks)} chunks"),
        Row(section, "words no chunk holds whole", float(lost), "words", "== 0", lost == 0),
    ]


def page_rows(repeat: int, *, quick: bool) -> list[Row]:
    """memory_get pages of a long note read whole and of a longer one read as a stream."""
    rows: list[Row] = []
    whole_lines, stream_lines = (6_000, 100_000) if quick else (60_000, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        (ws / "memory").mkdir()
        for name, count in (("whole.md", whole_lines), ("stream.md", stream_lines)):
            with open(ws / "memory" / name, "w", encoding="utf-8") as fh:
                fh.writelines(f"entry {i:07d} ok\n" for i in range(1, count + 1))
        cases = (
            ("whole.md", whole_lines, 1, 120),
            ("whole.md", whole_lines, 1, whole_lines),
            ("stream.md", stream_lines, 1, stream_lines),
            ("stream.md", stream_lines, stream_lines - 1_000, stream_lines),
        )
        for name, count, from_line, lines in cases:
            rel = f"memory/{name}"
            page = read_memory_page(ws, [], rel, from_line=from_line, lines=lines)
            ms = best_wall_ms(lambda rel=rel, f=from_line, n=lines: read_memory_page(
                ws, [], rel, from_line=f, lines=n), repeat)
            rows.append(Row(f"memory_get ({count:,}-line note)",
                            f"from={from_line:,} lines={lines:,} ({page.lines} lines returned)",
                            ms, "ms", f"<= {PAGE_FLOOR_MS:g} ms", check(ms, PAGE_FLOOR_MS)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="text size in MB of UTF-8 (default 2)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per timing; the best counts")
    parser.add_argument("--quick", action="store_true", help="0.1 MB, 2 runs (a smoke run)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    mb, repeat = (0.1, 2) if args.quick else (args.mb, max(1, args.repeat))
    lines = mixed_lines(int(mb * 1_000_000))
    snippets = ["\n".join(lines[i:i + 12]) for i in range(0, min(len(lines), 2400), 12)]
    section = f"{mb:g} MB mixed text ({len(lines)} lines)"
    weight_ms = best_ms(lambda: [text_weight(line) for line in lines], repeat)
    cjk_ms = best_ms(lambda: [contains_cjk(line) for line in lines], repeat)
    mmr_ms = best_ms(lambda: [mmr_tokens(s) for s in snippets], repeat)
    kw_ms = best_ms(lambda: [extract_keywords(q) for q in QUERIES * 200], repeat)
    rows = [
        Row(section, "text_weight over every line", weight_ms, "ms"),
        Row(section, "text_weight throughput", mb / (weight_ms / 1000), "MB/s"),
        Row(section, "contains_cjk over every line", cjk_ms, "ms"),
        Row(section, f"mmr_tokens per snippet ({len(snippets)} snippets of 12 lines)",
            mmr_ms * 1000 / len(snippets), "us"),
        Row(section, "extract_keywords per query (1,000 queries)", kw_ms, "us"),
        Row("checksum", "total text_weight", float(sum(text_weight(line) for line in lines)), "chars"),
        Row("checksum", "lines with CJK", float(sum(contains_cjk(line) for line in lines)), "lines"),
        *long_line_rows(repeat),
        *page_rows(repeat, quick=args.quick),
    ]
    emit("bench_text", rows, as_json=args.json, meta={"mb": mb, "repeat": repeat,
                                                      "python": sys.version.split()[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
