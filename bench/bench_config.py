"""Time to load + validate a full machine config (target: under 20 ms).

Run: .venv/bin/python bench/bench_config.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from kubeplane import config

EXAMPLE = Path(__file__).resolve().parent.parent / "tests/unit/config/examples/controlplane_full.yaml"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    text = EXAMPLE.read_text()
    for _ in range(10):
        config.load(text)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        config.load(text)
        samples.append((time.perf_counter() - start) * 1000)
    parse = []
    for _ in range(rounds // 4 or 1):
        start = time.perf_counter()
        config.document.parse(text)
        parse.append((time.perf_counter() - start) * 1000)
    print(f"load + validate {EXAMPLE.name} ({len(text)} bytes), {rounds} rounds:")
    print(f"  median {statistics.median(samples):.1f} ms, min {min(samples):.1f} ms, target < 20 ms")
    print(f"  of which YAML round-trip parsing: median {statistics.median(parse):.1f} ms")


if __name__ == "__main__":
    main()
