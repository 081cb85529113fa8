"""The lean loader of ``kubernetes_asyncio`` (``agent.operations.kubernetes._lean_import``), in a fresh
interpreter: no generated model and no other API class is imported, the source still lists, watches and
publishes end to end against the mock, and it costs far less memory than ``import kubernetes_asyncio.client``
(design §9: the idle operator's target is 40 MiB resident)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from tests.kube.apiserver import kubeconfig_for, serve
from tests.kube.conftest import spec

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]

_LEAN = """
import asyncio, json, sys
from agent.config.loader import OperationsSection
from agent.operations.kubernetes import KubernetesSource
from upgrade_core import OperationStatus

def rss_kib():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])

async def main():
    section = OperationsSection(source='kubernetes', kubeconfig=sys.argv[1], node_name='node-a',
                                namespace='default')
    src = await KubernetesSource.create(section, agent="demo-agent")
    ops = await src.snapshot()
    await src.wait_for_change(0.2)
    wrote = await src.publish(ops[0], OperationStatus(ops[0].operation, 'Failed', message='refused'))
    await src.aclose()
    mods = sorted(m for m in sys.modules if m.startswith('kubernetes_asyncio'))
    print(json.dumps({'ops': [o.name for o in ops], 'wrote': wrote, 'modules': mods, 'rss_kib': rss_kib()}))

asyncio.run(main())
"""

_FULL = """
import sys
import agent.operations.model
import kubernetes_asyncio.client, kubernetes_asyncio.config
for line in open('/proc/self/status'):
    if line.startswith('VmRSS:'):
        print(int(line.split()[1]))
"""


async def _python(code: str, *args: str) -> str:
    with anyio.fail_after(120):
        done = await anyio.run_process([sys.executable, "-c", code, *args], cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_lean_loader_skips_the_models_and_works_end_to_end(tmp_path: Path) -> None:
    async with serve() as mock:
        mock.put_object("default", {"metadata": {"name": "a"}, "spec": spec()})
        path = kubeconfig_for(mock.base_url, str(tmp_path / "kubeconfig"))
        report = json.loads(await _python(_LEAN, path))
        assert mock.status_writes("default", "a") == 1
    assert report["ops"] == ["default/a"] and report["wrote"] is True
    modules = report["modules"]
    assert not [m for m in modules if m.startswith("kubernetes_asyncio.client.models.")]
    assert "kubernetes_asyncio.client.api.core_v1_api" not in modules
    assert len(modules) < 30, modules
    full_kib = int(await _python(_FULL))
    # measured on 36.1.0: ~42 MiB lean (end to end) vs ~77 MiB for the package import alone
    assert report["rss_kib"] < full_kib - 20 * 1024, (report["rss_kib"], full_kib)
    print(f"lean end-to-end RSS {report['rss_kib'] / 1024:.1f} MiB, full import {full_kib / 1024:.1f} MiB")
