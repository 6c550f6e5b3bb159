"""The validating admission webhook: the planner's verdict at `kubectl apply` time, before anything is stored.

Reconcile refuses an impossible spec after the API server stored it (SpecValid=False in status), which a GitOps
pipeline sees as a green sync; here the same pure planner runs on the object under admission, so `kubectl apply`
and `kubectl apply --dry-run=server` fail with the planner's message (which field, which numbers, what would fit)
and print its warnings. Reconcile keeps refusing as before: the webhook is an early answer, not the only one
(failurePolicy Ignore lets everything in while the operator is down; nodes can change after admission).

What is never judged here: objects being deleted and updates that leave the spec as it was (finalizer removal, our
own annotation patches, label edits) — the chart's matchConditions skip them in the API server, and this handler
allows them too for API servers without matchConditions. `accelerator.type: auto` is judged against the nodes the
operator reads for reconcile; when that cannot decide (no GPU node yet, no read access to Nodes, an API error), the
object is allowed with a warning and reconcile decides once nodes exist.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import AcceleratorType
from vllm_operator.handlers import webhook
from vllm_operator.handlers.classes import ClassIndex
from vllm_operator.handlers.config import DEFAULT_CONFIG, OperatorConfig
from vllm_operator.handlers.reconcile import plan_context
from vllm_operator.k8s import KubeApi, KubeError
from vllm_operator.planning import plan_for

log = logging.getLogger(__name__)

RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)
WEBHOOK_ID = "validate-plan"
"""kopf's handler id, and so the webhook's URL path (`/validate-plan`) the chart's configuration names."""
REFUSED_CODE = 422  # the API server's own code for an invalid object (kubectl: "denied the request: ...")


@dataclass(frozen=True)
class Verdict:
    """What the webhook answers: allowed or the refusal's message, plus warnings kubectl prints either way."""

    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)


def _spec_unchanged(operation: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    return operation == "UPDATE" and old is not None and obj.get("spec") == old.get("spec")


async def review(kube: KubeApi, operation: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None,
                 config: OperatorConfig = DEFAULT_CONFIG, classes: ClassIndex | None = None) -> Verdict:
    """Plan the object as reconcile would and say whether the API server may store it. A workload class that
    cannot be resolved now is not a refusal: classes are separate objects that may be applied after (or with) the
    VLLMDeployment, and the dependent says so in its SpecValid condition until they exist."""
    if (obj.get("metadata") or {}).get("deletionTimestamp") or _spec_unchanged(operation, obj, old):
        return Verdict(True)
    try:
        resource = parse_resource(dict(obj))
    except SpecError as err:
        return Verdict(False, str(err))
    try:
        the_plan = plan_for(resource, await plan_context(kube, resource, config, classes))
    except SpecError as err:
        if err.field == "spec.workloadClass":
            return Verdict(True, warnings=[f"{err}; not judged at admission: the operator plans it once the class "
                                           "resolves (see status.conditions SpecValid)"])
        if resource.spec.accelerator.type is AcceleratorType.AUTO and err.field == "spec.accelerator.type":
            return Verdict(True, warnings=[f"{err}; not judged at admission: the operator decides once it "
                                           "reconciles (see status.conditions SpecValid)"])
        return Verdict(False, str(err))
    except KubeError as err:
        # Only `auto` reads the cluster; the API server did not answer, so the planner could not decide.
        return Verdict(True, warnings=[f"spec.accelerator.type: auto could not be judged at admission (reading "
                                       f"Nodes failed: {err}); the operator decides when it reconciles"])
    return Verdict(True, warnings=the_plan.all_warnings())


class AdmissionLogFilter(logging.Filter):
    """kopf logs every refusal as "Webhook 'validate-plan' failed permanently" at ERROR and every answer as
    "succeeded" at INFO; a refused spec is the user's mistake, which `review`'s caller logs once as a WARNING.
    Installed by `run.quiet_routine_successes` with the operator's other kopf log filters."""

    PREFIX = f"Webhook {WEBHOOK_ID!r} "

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.PREFIX)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """The validating handler (the memo must carry `kube`). Served only when settings.admission.server is set."""
    webhook_config = config.webhook
    if webhook_config is None:
        raise ValueError("the admission webhook needs OperatorConfig.webhook")

    @kopf.on.startup(registry=registry)
    async def _serve(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        memo.webhook = webhook.install(settings, webhook_config, memo.kube)

    @kopf.on.validate(*RESOURCE, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry)
    async def _validate(body: kopf.Body, dryrun: bool, warnings: list[str], memo: kopf.Memo, **kwargs: Any) -> None:
        operation: str = kwargs["operation"]
        old = kwargs.get("old")
        verdict = await review(memo.kube, operation, dict(body), dict(old) if old is not None else None, config,
                               memo.classes)
        warnings.extend(verdict.warnings)
        if not verdict.allowed:
            meta = body.get("metadata", {})
            log.warning("Refused %s of VLLMDeployment %s/%s at admission%s: %s", operation.lower(),
                        meta.get("namespace"), meta.get("name") or meta.get("generateName"),
                        " (dry run)" if dryrun else "", verdict.message)
            raise kopf.AdmissionError(verdict.message, code=REFUSED_CODE)
