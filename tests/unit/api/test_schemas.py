"""The Plan and RouterConfig JSON Schemas in the package match the models (regenerate with `make schemas`)."""

import pytest

from vllm_operator.api import schemas


@pytest.mark.parametrize("filename", sorted(schemas.MODELS), ids=sorted(schemas.MODELS))
def test_schema_file_matches_model(filename: str) -> None:
    on_disk = (schemas.SCHEMA_DIR / filename).read_text()
    assert on_disk == schemas.render(schemas.MODELS[filename]), f"{filename} drifted: run `make schemas`"
