"""What `vllm-operator plan` and `vllm-operator render` share: their input flags, reading the input, planning it.

Both commands take the same VLLMDeployment input the same way — `-f FILE` or a positional path, `-` for stdin as
kubectl does, `--gpu`, `--engine-version`, `--model-config` with `--weights-gib`, and the operator's
`--image-repository` — so the flags are defined once here
and each command adds only its own (`-o` formats, the scraper labels). Any input problem is a SpecError or a
UsageError with one line of text; the commands print it and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts, Plan
from vllm_operator.api.resource import VLLMDeployment, parse_resource
from vllm_operator.api.spec import ModelFacts, VLLMDeploymentSpec
from vllm_operator.images import (
    DEFAULT_IMAGES,
    ImageDefaults,
    add_image_pull_secret_argument,
    add_image_repository_argument,
    with_pull_secrets,
)
from vllm_operator.planning import catalog, classfile, profiles, weights_cache
from vllm_operator.planning.planner import PlanContext, plan_for, resolve_class

STDIN = "-"


class UsageError(Exception):
    """A command-line mistake; the CLIs print it as one line and exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def add_input_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    """The flags both commands take to read and plan a VLLMDeployment (`verb`: "planned" or "rendered")."""
    parser.add_argument("-f", "--file", metavar="FILE",
                        help=f"VLLMDeployment YAML, '-' for stdin (several documents are {verb} in turn)")
    parser.add_argument("path", nargs="?", metavar="FILE", help="the same as -f FILE")
    parser.add_argument("--gpu", metavar="TYPE",
                        help="plan for this GPU type (needed offline for accelerator.type auto)")
    parser.add_argument("--engine-version", metavar="V", help="vLLM version to plan the flags for (e.g. 0.26)")
    parser.add_argument("--model-config", metavar="FILE",
                        help="a Hugging Face config.json describing a model outside the catalog (the operator "
                             "needs the same numbers as spec.model.facts; `plan` prints that block)")
    parser.add_argument("--weights-gib", type=float, metavar="GIB",
                        help="weight size for --model-config (default: estimated from the shape)")
    parser.add_argument("--class", dest="class_files", action="append", default=[], metavar="FILE",
                        help="a file of VLLMWorkloadClass objects the spec's workloadClass is resolved among "
                             "(repeatable; classes inside the -f file count too; built-ins need none)")
    add_image_repository_argument(parser)
    add_image_pull_secret_argument(parser)
    weights_cache.add_arguments(parser)


def input_file(args: argparse.Namespace) -> str:
    """The one input file of `-f FILE` / the positional path (and --image-pull-secret folded into args.images, the
    --weights-cache-* flags into args.node_cache); UsageError when none or two different ones, or a flag is wrong."""
    if args.file and args.path and args.file != args.path:
        raise UsageError(f"two files given ({args.file}, {args.path}); give one -f FILE at a time")
    path: str | None = args.file or args.path
    if not path:
        raise UsageError("the following arguments are required: -f/--file (or a FILE argument; '-' for stdin)")
    if args.weights_gib is not None and not args.model_config:
        raise UsageError("--weights-gib only applies with --model-config")
    try:
        args.images = with_pull_secrets(args)  # the plan names every image and pull secret the pods get
    except ValueError as err:
        raise UsageError(f"--image-pull-secret: {err}") from None
    cache, problem = weights_cache.node_cache_argument_problem(args.weights_cache_host_path,
                                                                args.weights_cache_max_size)
    if cache is None:
        raise UsageError(f"--weights-cache-host-path/--weights-cache-max-size: {problem}")
    args.node_cache = cache
    return path


def display_name(path: str) -> str:
    return "stdin" if path == STDIN else path


def _read_text(path: str) -> str:
    if path == STDIN:
        try:
            return sys.stdin.read()
        except UnicodeDecodeError:
            raise SpecError("", "stdin is not UTF-8 text") from None
        except OSError as err:
            raise SpecError("", f"cannot read stdin: {err.strerror or err}") from None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as err:
        raise SpecError("", f"cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise SpecError("", f"{path} is not UTF-8 text") from None


def parse_documents(text: str, where: str) -> list[Any]:
    """The non-empty YAML documents of a text; SpecError (naming `where`) when invalid or empty."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError("", f"{where} is not valid YAML{at}: {problem}") from None
    if not docs:
        raise SpecError("", f"{where} is empty: expected a VLLMDeployment")
    return docs


def load_documents(path: str) -> list[Any]:
    """The non-empty YAML documents of a file (`-` = stdin); SpecError (naming the file) when unreadable, invalid
    or empty."""
    return parse_documents(_read_text(path), display_name(path))


def model_facts(path: str, weights_gib: float | None) -> ModelFacts:
    """spec.model.facts read off a Hugging Face config.json (`--model-config`)."""
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except OSError as err:
        raise SpecError("--model-config", f"cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError("--model-config", f"{path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise SpecError("--model-config", f"{path} must hold a JSON object (a Hugging Face config.json)")
    notes: list[str] = []
    facts = catalog.facts_from_hf_config(config, weights_gib=weights_gib, origin=f"--model-config {path}",
                                         notes=notes)
    for note in notes:  # what the estimate simplifies, how it counts sliding layers
        print(f"note: --model-config {path}: {note}", file=sys.stderr)
    return facts


def accelerator_for_gpu(resource: VLLMDeployment, gpu: str | None) -> AcceleratorFacts | None:
    """Facts for `--gpu TYPE` (None without the flag, so the planner uses the spec's own type)."""
    if gpu is None:
        return None
    if gpu in {"cpu", "auto"}:
        raise SpecError("--gpu", f"expects a GPU type from the catalog, not {gpu!r}")
    try:
        return catalog.gpu_facts(catalog.gpu_type(gpu), resource.spec.accelerator.count)
    except SpecError as err:
        raise SpecError("--gpu", err.message) from None


@dataclass(frozen=True)
class Planned:
    """One input document planned: the resource as read, the spec the plan was made from (with --model-config's
    facts), and the plan."""

    resource: VLLMDeployment
    spec: VLLMDeploymentSpec
    plan: Plan


def _is_class(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == constants.CLASS_KIND


def _inline_classes(docs: Sequence[Any]) -> dict[str, profiles.NamedClass]:
    found: dict[str, profiles.NamedClass] = {}
    for doc in docs:
        if _is_class(doc):
            name = str((doc.get("metadata") or {}).get("name") or "")
            try:
                found[name] = profiles.parse_class(doc)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise SpecError(f"VLLMWorkloadClass {name}: spec.{where}", first["msg"]) from None
    return found


def plan_documents(docs: Sequence[Any], *, gpu: str | None = None, engine_version: str | None = None,
                   facts: ModelFacts | None = None, images: ImageDefaults = DEFAULT_IMAGES,
                   classes: Mapping[str, profiles.NamedClass] | None = None,
                   node_cache: weights_cache.NodeCache = weights_cache.DEFAULT_NODE_CACHE) -> list[Planned]:
    """Plan every VLLMDeployment document (`facts`: --model-config's, in place of the spec's; `classes`: the
    --class files' VLLMWorkloadClasses, joined by those among `docs`); SpecError for the first refused."""
    out: list[Planned] = []
    known = {**(classes or {}), **_inline_classes(docs)}
    specs = [doc for doc in docs if not _is_class(doc)]
    if not specs:
        raise SpecError("", "no VLLMDeployment among the documents (only VLLMWorkloadClasses)")
    for doc in specs:
        resource = parse_resource(doc)
        spec = resource.spec
        if facts is not None:
            spec = spec.model_copy(update={"model": spec.model.model_copy(update={"facts": facts})})
        context = PlanContext(accelerator=accelerator_for_gpu(resource, gpu), images=images,
                              engine_version=engine_version, workload_class=resolve_class(spec, known),
                              node_cache=node_cache)
        the_plan = plan_for(resource.model_copy(update={"spec": spec}), context)
        out.append(Planned(resource, spec, the_plan))
    return out


def plan_input(path: str, args: argparse.Namespace) -> list[Planned]:
    """Read `path` and plan each document with the shared flags of `add_input_arguments`."""
    facts = model_facts(args.model_config, args.weights_gib) if args.model_config else None
    classes = classfile.load_classes(Path(p) for p in args.class_files)
    return plan_documents(load_documents(path), gpu=args.gpu, engine_version=args.engine_version, facts=facts,
                          images=args.images, classes=classes, node_cache=args.node_cache)


def facts_block(facts: ModelFacts) -> str:
    """The YAML to put under `spec.model` so the operator (which has no --model-config) plans the same model."""
    return yaml.safe_dump({"spec": {"model": {"facts": facts.to_wire()}}}, sort_keys=False, default_flow_style=False)


def facts_missing(item: Planned) -> bool:
    """True when the plan used --model-config facts the VLLMDeployment itself does not carry."""
    return item.spec.model.facts is not None and item.resource.spec.model.facts != item.spec.model.facts
