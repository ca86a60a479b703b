"""Local embedding time per text with OpenMP's default wait policy and with ``OMP_WAIT_POLICY=PASSIVE``.

Each run is a fresh process (libgomp reads the variable once, when it loads) that loads the GGUF
model the way the local provider does and embeds each text of a fixed set one at a time, then
once as one batch; the first text is embedded once before timing (warm-up). Runs are paired: every
round runs both policies back to back, in alternating order. ``--burn N`` adds N busy-loop
processes for the whole run (a loaded host); they are stopped by pid at the end.

Usage: ``python3 scripts/bench_omp.py [--model PATH] [--rounds 3] [--burn 0] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO.parent / "shared" / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"
POLICIES = ("default", "PASSIVE")

_WORDS = ("the team met on Tuesday to review the memory index, the release plan and the open"
          " questions about caching embeddings across hosts; Caroline said the") .split()


def _texts() -> list[str]:
    """Four texts of about 20, 100, 250 and 400 tokens (deterministic)."""
    return [" ".join(_WORDS[i % len(_WORDS)] for i in range(n)) for n in (16, 80, 200, 330)]


_CHILD = r"""
import json, sys, time
from llama_cpp import Llama
texts = json.loads(sys.argv[2])
llama = Llama(model_path=sys.argv[1], embedding=True, verbose=False)
llama.embed([texts[0]], normalize=True, truncate=True)
out = {}
for i, t in enumerate(texts):
    t0 = time.perf_counter()
    llama.embed([t], normalize=True, truncate=True)
    out[f"text{i}"] = (time.perf_counter() - t0) * 1000
t0 = time.perf_counter()
llama.embed(texts * 8, normalize=True, truncate=True)
out["batch32"] = (time.perf_counter() - t0) * 1000
print(json.dumps(out))
"""


def _run(model: Path, policy: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", _CHILD, str(model), json.dumps(_texts())],
                          env=env, capture_output=True, text=True, check=True, timeout=600)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--burn", type=int, default=0, help="busy-loop processes to add (load)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.burn)]
    try:
        load = os.getloadavg()[0]
        runs: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
        for r in range(args.rounds):
            for policy in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
                runs[policy].append(_run(args.model, policy))
        load = max(load, os.getloadavg()[0])
    finally:
        for b in burners:
            b.kill()
            b.wait()
    keys = list(runs[POLICIES[0]][0])
    table = {p: {k: round(statistics.median(run[k] for run in runs[p]), 1) for k in keys}
             for p in POLICIES}
    if args.json:
        print(json.dumps({"load": round(load, 1), "burn": args.burn, "median_ms": table,
                          "runs": runs}))
        return 0
    print(f"load ~{load:.1f}, +{args.burn} busy loops, {args.rounds} paired rounds, median ms")
    print(f"{'policy':<10}" + "".join(f"{k:>10}" for k in keys))
    for p in POLICIES:
        print(f"{p:<10}" + "".join(f"{table[p][k]:>10.1f}" for k in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
