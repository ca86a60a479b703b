"""Benchmark the per-character text helpers on a mixed English/CJK text: chunk weights and CJK tests.

``text_weight`` runs on every line the builtin engine indexes, ``contains_cjk`` on every chunk
(trigram table) and query token, ``mmr_tokens`` on every snippet MMR compares, and
``extract_keywords`` on every keyword-fallback query. The text is deterministic: Markdown lines
drawn from English notes and Japanese, Chinese and Korean lines (about 20 % of the lines CJK),
repeated up to ``--mb`` megabytes of UTF-8. Each timing is the best of ``--repeat`` runs over
all lines, in CPU time of this process (the helpers are single-threaded and CPU-bound, so
other load on a shared machine does not count). The ``checksum`` rows (total weight, CJK line count) let two runs be compared for
equal results as well as speed.

Usage: python3 scripts/bench_text.py [--mb 2] [--repeat 5] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Row, emit  # noqa: E402

from fallback.search.ranking import mmr_tokens  # noqa: E402
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
    ]
    emit("bench_text", rows, as_json=args.json, meta={"mb": mb, "repeat": repeat,
                                                      "python": sys.version.split()[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
