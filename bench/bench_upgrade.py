"""Benchmark of ``kubeplane upgrade-k8s`` on an existing cluster; prints figures, asserts nothing.

Prints the seconds of each component-node step (median, min, max) and of the whole run, against
the reference's ≈ 14 s a step (9 steps in 2 min 7 s for 3 control plane nodes), and how many of
the requests a client sent through the endpoint every 100 ms failed meanwhile.

Run against a local cluster at the source version (``kubeplane cluster create`` made it):

    .venv/bin/python bench/bench_upgrade.py --kubeplaneconfig CLIENT_CONFIG \\
        --kubeconfig KUBECONFIG [--state KUBEPLANE_STATE_DIR] [--to v1.20.2-kp.1]

The run helpers and the request pollers (HTTP/1.1 kept alive, and HTTP/2) are the e2e test's
(tests/e2e/test_upgrade.py, tests/e2e/e2e_clients.py), so the benchmark measures exactly what the
test checks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from e2e_clients import ApiPoller, Http2Poller, run_cli
from test_upgrade import COMPONENTS, TARGET, step_seconds

REFERENCE_STEP_SECONDS = 127 / 9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeplaneconfig", required=True, help="client config of the cluster")
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig (server = the endpoint)")
    parser.add_argument("--state", help="KUBEPLANE_STATE of the local cluster (for its haproxy)")
    parser.add_argument("--to", default=TARGET, help=f"target version (default {TARGET})")
    parser.add_argument("--show-output", action="store_true", help="print the CLI's output too")
    args = parser.parse_args()
    env = {"KUBEPLANECONFIG": args.kubeplaneconfig, **({"KUBEPLANE_STATE": args.state} if args.state else {})}

    started = time.monotonic()
    with ApiPoller(Path(args.kubeconfig)) as probe, Http2Poller(Path(args.kubeconfig)) as h2_probe:
        run = run_cli(env, "upgrade-k8s", "--to", args.to)
    total = time.monotonic() - started
    if args.show_output:
        print("\n".join(f"| {line}" for line in run.lines))
    if run.returncode != 0:
        print("\n".join(run.lines[-30:]))
        print(f"upgrade-k8s failed with exit code {run.returncode}")
    steps = step_seconds(run.lines)
    component_steps = [
        seconds for component, _, seconds, what in steps if component in COMPONENTS and what == "done"
    ]
    for component, where, seconds, what in steps:
        print(f"  {component:<24} {where:<22} {seconds:6.1f}s  {what}")
    if component_steps:
        median = statistics.median(component_steps)
        print(
            f"component-node steps: {len(component_steps)}, median {median:.1f}s "
            f"(min {min(component_steps):.1f}s, max {max(component_steps):.1f}s); "
            f"reference ≈ {REFERENCE_STEP_SECONDS:.1f}s → ratio {median / REFERENCE_STEP_SECONDS:.2f}"
        )
    print(f"total: {total:.1f}s (reference 127s for the 9 component steps, kube-proxy not included)")
    print(
        f"API requests through the endpoint, HTTP/1.1 kept alive: {probe.requests}, failed: "
        f"{len(probe.failures)} (keep-alive connection closed by a stopping API server: "
        f"{len(probe.closed)}), longest gap {probe.longest_gap:.1f}s; HTTP/2: {h2_probe.requests}, "
        f"failed: {len(h2_probe.failures)}, sent again after a GOAWAY: {len(h2_probe.retried)}, "
        f"longest gap {h2_probe.longest_gap:.1f}s"
    )
    for failure in [*probe.failures, *h2_probe.failures]:
        print(f"  {failure}")


if __name__ == "__main__":
    main()
