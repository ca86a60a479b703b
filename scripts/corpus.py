"""Deterministic generator of daily-note memory workspaces for the benchmarks.

A workspace holds ``MEMORY.md`` and ``memory/YYYY-MM-DD.md`` daily notes (one per day from
2020-01-01), written in English with some Japanese and Chinese lines. File ``i`` depends only on
``(seed, i, file_bytes)``, never on how many files are generated, so a 1,000-file workspace is
the first 1,000 files of a 10,000-file one.

Every note carries a unique planted token (``zq`` + letters, see :func:`planted_token`) in its
third line, so a benchmark can search for a known single hit; every 5th note (by default) has a
few CJK lines.

Importable (``generate_workspace``, ``change_file``, ``planted_token``, ``BENCH_QUERIES``) and
runnable: ``python3 scripts/corpus.py OUT_DIR --files 2000 --file-bytes 20000``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BENCH_QUERIES",
    "CJK_QUERIES",
    "CorpusInfo",
    "change_file",
    "generate_workspace",
    "note_path",
    "planted_token",
]

# First day of the daily notes; note i is this date plus i days.
FIRST_DAY = dt.date(2020, 1, 1)
# Default size of one note in UTF-8 bytes (the 2,000 files / 40 MB target uses 20,000).
DEFAULT_FILE_BYTES = 2_000
# Sentences in the shared English pool; notes draw lines from it (fast and deterministic).
ENGLISH_POOL = 3_000

_SUBJECTS = ("Dana", "Priya", "Kenji", "the billing team", "the on-call engineer", "ops",
             "the scheduler", "the NAS", "the router", "the support desk", "Marta", "Leo",
             "the data team", "the release train", "the family budget", "the search index")
_VERBS = ("reviewed", "migrated", "rebooted", "postponed", "documented", "benchmarked",
          "replaced", "upgraded", "debugged", "archived", "scheduled", "measured", "fixed",
          "rolled back", "planned", "discussed", "shipped", "tested", "monitored", "cleaned up")
_OBJECTS = ("the nightly revenue report", "the webhook timeout", "the cron inventory",
            "the backup job", "the exchange-rate fetch", "the Parquet feed", "the VLAN config",
            "the DNS filter", "the login flow", "the invoice export", "the snapshot schedule",
            "the index rebuild", "the retry policy", "the dashboard", "the grocery list",
            "the running plan", "the deploy script", "the SQLite lock", "the embedding cache",
            "the rollout checklist", "the ticket triage", "the payment gateway")
_TAILS = ("before lunch", "after the standup", "with a rollback path", "in under an hour",
          "without downtime", "for the third time this week", "and wrote it down",
          "because the alerts kept firing", "as agreed on Tuesday", "on the staging cluster",
          "while the queue drained", "and filed a follow-up", "pending a review",
          "with a lock file", "at 02:00", "in the evening", "for the quarterly report")
_TOPICS = ("Work", "Home", "Health", "Projects", "Family", "Reading", "Ops log", "Ideas")
_CJK_LINES = (
    "渡辺さんと東京チームのデータ連携について打ち合わせ。Parquetで受け渡し。",
    "家計簿アプリの同期処理でSQLiteのロックエラー。WALモードで解決。",
    "東京チームからデータを受領。文字コードの問題なし。",
    "来週の会議は午前十時から。議題は検索の精度改善。",
    "今天和团队讨论了数据库迁移的计划，下周开始执行。",
    "晚上跑步五公里，用时二十六分钟。",
    "路由器重启以后网络恢复正常。",
    "プロジェクトの進捗を上司に報告した。次はリリース準備。",
    "バックアップの容量が不足している。古いスナップショットを削除。",
    "周末整理了家庭预算，食品支出增加了百分之八。",
)

# Queries the benchmarks time: common words, phrases, rare words, a CJK run and a miss.
BENCH_QUERIES = (
    "webhook timeout", "nightly revenue report", "rollback path", "Parquet feed",
    "SQLite lock", "the scheduler retries", "backup job failed", "DNS filter",
    "invoice export dashboard", "Priya billing", "Kenji data team", "grocery list",
    "embedding cache index rebuild", "login flow staging", "payment gateway alerts",
    "nonexistentword",
)
# CJK queries (substring search in the builtin engine).
CJK_QUERIES = ("東京チーム", "家計簿アプリ", "数据库迁移", "バックアップ")


@dataclass(frozen=True)
class CorpusInfo:
    """What :func:`generate_workspace` wrote.

    Attributes:
        root: the workspace folder.
        files: number of daily notes (``MEMORY.md`` not counted).
        total_bytes: UTF-8 bytes of all notes plus ``MEMORY.md``.
        file_bytes: requested size of one note in bytes.
        seed: generator seed.
    """

    root: Path
    files: int
    total_bytes: int
    file_bytes: int
    seed: int


def planted_token(index: int) -> str:
    """The unique token planted in note ``index``: ``zq`` + base-26 letters (``zqaaaab``).

    Letters only, so every FTS tokenizer keeps it as one token.
    """
    letters = []
    n = index
    for _ in range(5):
        n, r = divmod(n, 26)
        letters.append(chr(ord("a") + r))
    return "zq" + "".join(reversed(letters))


def note_path(index: int) -> str:
    """Workspace-relative path of note ``index``: ``memory/YYYY-MM-DD.md``."""
    return f"memory/{(FIRST_DAY + dt.timedelta(days=index)).isoformat()}.md"


def _english_pool(seed: int) -> list[str]:
    rng = random.Random(f"pool:{seed}")
    return [f"{rng.choice(_SUBJECTS)} "
            f"{rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}; "
            f"ref {rng.randrange(100, 9999)}." for _ in range(ENGLISH_POOL)]


def _note_text(index: int, *, seed: int, file_bytes: int, cjk_every: int,
               pool: list[str]) -> str:
    rng = random.Random(f"note:{seed}:{index}")
    day = (FIRST_DAY + dt.timedelta(days=index)).isoformat()
    lines = [f"# {day}", "", f"- Ticket {planted_token(index)} recorded for {rng.choice(_OBJECTS)}."]
    size = sum(len(x.encode("utf-8")) + 1 for x in lines)
    cjk = cjk_every > 0 and index % cjk_every == 0
    while size < file_bytes:
        if rng.random() < 0.08:
            line = f"\n## {rng.choice(_TOPICS)}"
        elif cjk and rng.random() < 0.15:
            line = f"- {rng.choice(_CJK_LINES)}"
        else:
            line = f"- {rng.choice(pool)} {rng.choice(pool)}"
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return "\n".join(lines) + "\n"


def _memory_md(seed: int) -> str:
    rng = random.Random(f"memory:{seed}")
    people = "\n".join(f"- {name} works on {rng.choice(_OBJECTS)}." for name in
                       ("Dana", "Priya", "Kenji", "Marta", "Leo"))
    return (f"# MEMORY\n\nCurated long-term facts (generated corpus, seed {seed}).\n\n"
            f"## People\n{people}\n\n## Preferences\n- Flat white with oat milk.\n"
            "- 会議は午前九時半以降。\n")


def generate_workspace(root: str | Path, *, files: int, file_bytes: int = DEFAULT_FILE_BYTES,
                       seed: int = 42, cjk_every: int = 5, clean: bool = True) -> CorpusInfo:
    """Write a workspace of ``files`` daily notes plus ``MEMORY.md`` under ``root``.

    Args:
        root: workspace folder (created).
        files: number of daily notes, >= 0.
        file_bytes: approximate UTF-8 size of one note in bytes (each note ends at the first
            line that reaches it), >= 1.
        seed: generator seed; the same arguments always give the same bytes.
        cjk_every: every n-th note gets CJK lines (0 = none).
        clean: remove an existing ``memory/`` folder first.

    Returns:
        A :class:`CorpusInfo` with the total size in bytes.

    Raises:
        ValueError: ``files < 0`` or ``file_bytes < 1``.
    """
    if files < 0 or file_bytes < 1:
        raise ValueError("files must be >= 0 and file_bytes >= 1")
    ws = Path(root)
    mem = ws / "memory"
    if clean and mem.exists():
        shutil.rmtree(mem)
    mem.mkdir(parents=True, exist_ok=True)
    pool = _english_pool(seed)
    head = _memory_md(seed).encode("utf-8")
    (ws / "MEMORY.md").write_bytes(head)
    total = len(head)
    for i in range(files):
        data = _note_text(i, seed=seed, file_bytes=file_bytes, cjk_every=cjk_every,
                          pool=pool).encode("utf-8")
        (ws / note_path(i)).write_bytes(data)
        total += len(data)
    return CorpusInfo(root=ws, files=files, total_bytes=total, file_bytes=file_bytes, seed=seed)


def change_file(root: str | Path, index: int, token: str) -> Path:
    """Append one bullet holding ``token`` to note ``index``; returns the file's path.

    Raises:
        FileNotFoundError: note ``index`` was not generated.
    """
    path = Path(root) / note_path(index)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"- Late addition: {token} noted for the follow-up.\n")
    return path


def main() -> None:
    """CLI: generate a workspace and print its size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="workspace folder to write")
    parser.add_argument("--files", type=int, default=1000, help="daily notes (default 1000)")
    parser.add_argument("--file-bytes", type=int, default=DEFAULT_FILE_BYTES,
                        help=f"bytes per note (default {DEFAULT_FILE_BYTES})")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cjk-every", type=int, default=5, help="every n-th note has CJK lines")
    args = parser.parse_args()
    info = generate_workspace(args.out, files=args.files, file_bytes=args.file_bytes,
                              seed=args.seed, cjk_every=args.cjk_every)
    print(f"{info.root}: {info.files} notes + MEMORY.md, {info.total_bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
