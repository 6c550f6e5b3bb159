"""The VLLMDeployment object as a whole and the parser every entry point uses.

`parse_resource` accepts what a user hands us (a dict from YAML or from the API server) and returns the typed
object, or raises SpecError with every problem named by its field path — never a raw pydantic traceback.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, ValidationError

from vllm_operator import constants
from vllm_operator.api.base import ApiModel
from vllm_operator.api.errors import SpecError, from_validation_error
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.api.status import VLLMDeploymentStatus


class ObjectMeta(ApiModel):
    """The part of metadata the operator reads; everything else is kept by the API server, not by us."""

    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(description="Object name.")
    namespace: Annotated[str, StringConstraints(max_length=63)] = Field(default="default", description="Namespace.")
    uid: str | None = Field(default=None, description="Server-set uid.")
    generation: int | None = Field(default=None, description="Server-set generation.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")


class VLLMDeployment(ApiModel):
    """A complete VLLMDeployment object."""

    api_version: str = Field(description="vllm-operator.dev/v1alpha1.")
    kind: str = Field(description="VLLMDeployment.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: VLLMDeploymentSpec = Field(description="Desired state.")
    status: VLLMDeploymentStatus | None = Field(default=None, description="Observed state.")


def parse_spec(spec: Any) -> VLLMDeploymentSpec:
    """Validate a spec dict; SpecError names every bad field."""
    if not isinstance(spec, dict):
        raise SpecError("spec", f"must be a mapping, got {type(spec).__name__}")
    try:
        return VLLMDeploymentSpec.model_validate(spec)
    except ValidationError as err:
        raise from_validation_error(err, "spec") from None


def parse_resource(obj: Any) -> VLLMDeployment:
    """Validate a whole object (apiVersion, kind, metadata, spec). Status is parsed leniently: it is ours."""
    if not isinstance(obj, dict):
        raise SpecError("", f"expected a {constants.KIND} mapping, got {type(obj).__name__}")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if kind != constants.KIND:
        raise SpecError("kind", f"expected {constants.KIND}, got {kind!r}")
    if api_version != constants.API_VERSION:
        raise SpecError("apiVersion", f"expected {constants.API_VERSION}, got {api_version!r}")
    if "spec" not in obj:
        raise SpecError("spec", "required field is missing")
    spec = parse_spec(obj["spec"])
    try:
        meta = ObjectMeta.model_validate(obj.get("metadata") or {})
    except ValidationError as err:
        raise from_validation_error(err, "metadata") from None
    status = None
    if isinstance(obj.get("status"), dict):
        try:
            status = VLLMDeploymentStatus.model_validate(obj["status"])
        except ValidationError:
            status = None  # status is rewritten by the operator; a stale shape must not block reconciling
    return VLLMDeployment(api_version=api_version, kind=kind, metadata=meta, spec=spec, status=status)
