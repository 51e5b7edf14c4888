"""What the ``kubeplaned`` process imports, and its command line (argparse, not click).

The agent's idle memory is mostly the code of the modules it imports (docs/architecture.md,
Memory), so libraries it does not use must stay out of its import graph: httpx's command-line
client and the click, rich and pygments it brings; pyroute2 (with its sqlite3-backed NDB), which
only the network I/O modules load, on first use; and httpx, also imported on first use. The graph
is taken in a fresh interpreter: this test process has imported everything already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kubeplane
from kubeplane.agent import main
from kubeplane.config import defaults

pytestmark = pytest.mark.unit

SRC = Path(kubeplane.__file__).parent.parent
#: Top-level modules the agent must not import when it starts.
LEFT_OUT = ("click", "rich", "pygments", "pyroute2", "sqlite3")


def imported_by(script: str) -> set[str]:
    """The modules imported (``sys.modules`` less its blocking ``None`` entries) after ``script``
    runs in a fresh interpreter on this source."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{script}\nimport sys\nprint('\\n'.join(n for n, m in sys.modules.items() if m is not None))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    return set(result.stdout.split())


def top_level(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_agent_entry_point_leaves_unused_libraries_out() -> None:
    modules = imported_by("import kubeplane.agent.main")
    assert "kubeplane.agent.node" in modules  # the whole agent, not a lazy shell of it
    # httpx is imported on first use: an agent in maintenance mode makes no HTTP request.
    assert "httpx" not in modules
    assert top_level(modules).isdisjoint(LEFT_OUT), sorted(top_level(modules) & set(LEFT_OUT))


#: What a booted node needs and a node in maintenance mode (waiting for its first config) must not
#: have loaded: the config models and their libraries, the controllers, services and clients.
BOOTED_ONLY = (
    "pydantic",
    "pydantic_core",
    "ruamel",
    "httpx",
    "pyroute2",
    "kubeplane.config.models",
    "kubeplane.config.document",
    "kubeplane.controllers",
    "kubeplane.clients",
    "kubeplane.agent.controllers",
    "kubeplane.agent.services",
    "kubeplane.agent.etcd",
    "kubeplane.api.trustd",
)

#: A real node in maintenance mode (no machine config under its root), serving its maintenance
#: API on a free loopback port until the test's client has answered Version; then it stops.
MAINTENANCE = """
import asyncio, pathlib, tempfile
from kubeplane.agent.node import Node
from kubeplane.api import NodeClient

async def main(root):
    node = Node(root=pathlib.Path(root), listen="127.0.0.1:0", services=False)
    running = asyncio.create_task(node.run())
    while node._server is None:
        if running.done():
            running.result()  # it failed: say why
        await asyncio.sleep(0.01)
    async with NodeClient.insecure([f"127.0.0.1:{node._server.port}"]) as client:
        assert (await client.version())[0].unwrap()["maintenance"] is True
    node.stop()
    await running

with tempfile.TemporaryDirectory() as root:
    asyncio.run(main(root))
"""


def test_maintenance_mode_loads_nothing_only_a_booted_node_needs() -> None:
    """A node waiting for its first config serves the maintenance API without the config models,
    the controllers, services and clients (kubeplane.lazy): that is most of its idle memory."""
    modules = imported_by(MAINTENANCE)
    assert "kubeplane.agent.node" in modules and "kubeplane.api.server" in modules
    loaded = sorted(name for name in modules if name.startswith(BOOTED_ONLY))
    assert loaded == []


def test_the_upgrade_check_imports_what_the_agent_imports_on_first_use() -> None:
    """``check()`` (what an upgrade runs in a new build) loads every booted-only module, so a
    build whose controllers or config models do not import is refused before it is installed."""
    modules = imported_by("import kubeplane.agent.main as m\nm.check()")
    wanted = [name for name in BOOTED_ONLY if name not in ("httpx", "pyroute2")]  # used on first call
    missing = [name for name in wanted if not any(m == name or m.startswith(f"{name}.") for m in modules)]
    assert missing == []


def test_httpx_works_without_its_command_line_client() -> None:
    """The agent package blocks ``httpx._main`` only; httpx, imported later, keeps working."""
    modules = imported_by(
        "import kubeplane.agent.main, httpx\n"
        "response = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(204))).get('http://x/')\n"
        "assert response.status_code == 204"
    )
    assert "httpx._main" not in modules
    assert top_level(modules).isdisjoint({"click", "rich", "pygments"})


def test_network_io_loads_pyroute2_on_first_use() -> None:
    modules = imported_by(
        "from kubeplane.services import machinenet_io, podnet\n"
        "import sys\n"
        "assert 'pyroute2' not in sys.modules\n"
        "machinenet_io.observe()"
    )
    assert "pyroute2.iproute" in modules


def test_command_line_defaults() -> None:
    args = main._parser().parse_args([])
    assert (args.root, args.listen, args.node_name, args.services, args.metrics_port, args.log_level) == (
        Path("/"),
        f"0.0.0.0:{defaults.DEFAULT_NODE_API_PORT}",
        None,
        True,
        defaults.DEFAULT_METRICS_PORT,
        "info",
    )
    assert args.command is None


def test_command_line_options() -> None:
    args = main._parser().parse_args(
        [
            "--root",
            "/srv/node",
            "--listen",
            "127.0.0.5:50000",
            "--node-name",
            "cp-1",
            "--no-services",
            "--metrics-port",
            "0",
            "--log-level",
            "debug",
        ]
    )
    assert (args.root, args.listen, args.node_name, args.services, args.metrics_port, args.log_level) == (
        Path("/srv/node"),
        "127.0.0.5:50000",
        "cp-1",
        False,
        0,
        "debug",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metrics-port", "65536"], "65536 is not in the range 0<=x<=65535"),
        (["--metrics-port", "x"], "'x' is not a valid integer"),
        (["--log-level", "trace"], "invalid choice: 'trace'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_command_line_refusals(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main.run(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_root_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "file"
    root.write_text("")
    with pytest.raises(SystemExit) as exited:
        main.run(["--root", str(root)])
    assert exited.value.code == 2
    assert "is a file" in capsys.readouterr().err


def test_version_command(capsys: pytest.CaptureFixture[str]) -> None:
    main.run(["version"])
    assert capsys.readouterr().out == f"kubeplaned {kubeplane.__version__}\n"
