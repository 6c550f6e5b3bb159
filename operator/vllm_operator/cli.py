"""The `vllm-operator` command: one entry point, one module per subcommand.

Each subcommand lives next to the code it drives and exposes `main(argv) -> int`; this file only dispatches, so
adding a subcommand never touches another one's parsing. Imports are lazy so `vllm-operator plan` does not pay for
kopf or aiohttp.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("vllm_operator.crds", "print the CustomResourceDefinition generated from the API models"),
    "plan": ("vllm_operator.planning.cli", "plan a VLLMDeployment: engine args, KV budget, capacity, warnings"),
    "render": ("vllm_operator.rendering.cli", "render a VLLMDeployment to the manifests the operator would apply"),
    "run": ("vllm_operator.handlers.run", "run the operator (kopf) against the current kubeconfig"),
    "router": ("vllm_operator.router.main", "run the length-aware OpenAI-compatible router"),
    "engine": ("vllm_operator.engine.main", "run vLLM under the entrypoint wrapper (engine pods' command)"),
    "fetch": ("vllm_operator.engine.fetch", "put a Hub model into the node's weights cache (engine init container)"),
}


def usage() -> str:
    lines = ["usage: vllm-operator <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"vllm-operator: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
