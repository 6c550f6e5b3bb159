"""One event per verb and reconcile names every child it can, within the event message limit."""

from __future__ import annotations

from vllm_operator.handlers.reconcile import EVENT_MESSAGE_LIMIT, change_message


def test_names_every_child() -> None:
    items = ["Deployment ns/a-short", "Service ns/a-short", "ConfigMap ns/a-router"]
    assert change_message("Created", items) == (
        "Created 3 children: Deployment ns/a-short, Service ns/a-short, ConfigMap ns/a-router")
    assert change_message("Deleted", items[:1]) == "Deleted 1 child: Deployment ns/a-short"


def test_fourteen_children_with_long_names_fit() -> None:
    items = [f"PodDisruptionBudget some-namespace/{'x' * 40}-{i}" for i in range(14)]
    text = change_message("Created", items)
    assert len(text) <= EVENT_MESSAGE_LIMIT
    assert text.startswith("Created 14 children: ")
    shown = text.removeprefix("Created 14 children: ").split(", ")
    assert shown[-1].startswith("... and ")
    left = int(shown[-1].split()[2])
    assert len(shown) - 1 + left == 14 and shown[:-1] == items[: 14 - left]


def test_a_single_name_longer_than_the_limit() -> None:
    text = change_message("Updated", ["x" * 2000], limit=100)
    assert text == "Updated 1 child: ... and 1 more"
