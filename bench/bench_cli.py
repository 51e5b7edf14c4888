"""Start-up cost of the ``kubeplane`` CLI and of importing the agent.

Every CLI command is a new process, and scripts, the e2e tests and ``cluster create`` run many:
what a command costs before it does anything is paid each time. For each command below (none
needs a node or a cluster), ROUNDS runs: median wall time and median user + system CPU time. Then
the resident memory of a fresh interpreter after ``import kubeplane.agent.main``, which is most
of an idle agent in maintenance mode (``bench_agent.py --rss-only`` measures the real one).

Run: .venv/bin/python bench/bench_cli.py [ROUNDS]   (default 10; nothing else should be running)
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ENDPOINT = "https://127.0.0.1:6443"
EXAMPLE = Path(__file__).resolve().parent.parent / "tests/unit/config/examples/controlplane_full.yaml"


def run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def agent_import_rss() -> str:
    script = (
        "import kubeplane.agent.main\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "print(int(status['VmRSS'].split()[0]) / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return f"{float(out.stdout):.1f} MB"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    cli = str(BIN / "kubeplane")
    with tempfile.TemporaryDirectory(prefix="kubeplane-bench-cli-") as tmp:
        out = Path(tmp) / "gen"
        commands = {
            "version --client": [cli, "version", "--client"],
            "--help": [cli, "--help"],
            "get --help": [cli, "get", "--help"],
            "validate (a full config)": [cli, "validate", "--mode", "metal", "-f", str(EXAMPLE)],
            "gen config": [cli, "gen", "config", "bench", ENDPOINT, "-o", str(out), "--force"],
        }
        print(f"kubeplane CLI start-up, {rounds} runs each (median wall / median CPU):")
        for name, argv in commands.items():
            run(argv)  # warm the page cache
            samples = [run(argv) for _ in range(rounds)]
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            print(f"  {name:28s} {wall * 1000:6.0f} ms wall  {cpu * 1000:6.0f} ms CPU")
    print(f"import kubeplane.agent.main in a fresh interpreter: {agent_import_rss()} resident")


if __name__ == "__main__":
    main()
