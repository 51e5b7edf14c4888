"""kubeplane.agent (see docs/architecture.md for what this layer owns).

Importing this package keeps httpx's command-line client out of the process: ``import httpx``
also imports ``httpx._main`` and with it click, rich and pygments whenever they are installed
(they are, for the kubeplane CLI), about 3 MB of resident memory the agent never uses. A
``None`` entry in :data:`sys.modules` makes that one import fail, which httpx answers with a
stub ``httpx.main``; nothing of kubeplane calls it. It is set here, before any agent module
imports httpx, and only when nothing imported ``httpx._main`` already (a process that did keeps
it). ``tests/unit/agent/test_agent_imports.py`` checks the agent's import graph.
"""

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
