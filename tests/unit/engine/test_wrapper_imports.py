"""The engine wrapper runs inside vLLM's image, installed without dependencies: it may load nothing of the product but
the contract module, and none of the operator's dependencies (pydantic, kopf, the Kubernetes client, aiohttp). Its
status endpoint uses the stdlib's http.server and prometheus_client, which vLLM itself depends on."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import vllm_operator.engine.main
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in
                        {'vllm_operator', 'pydantic', 'kopf', 'kubernetes', 'aiohttp', 'yaml', 'jinja2'})))
"""


def test_the_wrapper_loads_only_itself_and_the_contract_module() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout) == ["vllm_operator", "vllm_operator.constants", "vllm_operator.engine",
                                       "vllm_operator.engine.adapters", "vllm_operator.engine.amx",
                                       "vllm_operator.engine.childsite", "vllm_operator.engine.cpubind",
                                       "vllm_operator.engine.downloads",
                                       "vllm_operator.engine.eviction", "vllm_operator.engine.idleprobe",
                                       "vllm_operator.engine.main",
                                       "vllm_operator.engine.phases", "vllm_operator.engine.preflight",
                                       "vllm_operator.engine.status"]
