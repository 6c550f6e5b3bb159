"""Shared pytest wiring: fixture modules from tests/support are registered here."""

pytest_plugins = ["tests.support.kube", "tests.support.vllm_fixtures", "tests.support.images"]
