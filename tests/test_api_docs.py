"""The API docs describe every operation and every parameter: a test walks the generated schema."""

from __future__ import annotations

from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from quicksave.api_docs import first_sentence

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    schema: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
    return schema


def operations(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{method.upper()} {path}", operation)
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
        if isinstance(operation, dict)
    ]


def test_the_schema_has_the_api(schema: dict[str, Any]) -> None:
    assert len(operations(schema)) >= 40


def test_every_operation_has_a_description_and_a_summary(schema: dict[str, Any]) -> None:
    undescribed = [name for name, operation in operations(schema) if not operation.get("description", "").strip()]
    unsummarised = [name for name, operation in operations(schema) if not operation.get("summary", "").strip()]

    assert undescribed == []
    assert unsummarised == []


def test_every_parameter_has_a_description(schema: dict[str, Any]) -> None:
    undescribed = [
        f"{name}: {parameter['in']} parameter {parameter['name']}"
        for name, operation in operations(schema)
        for parameter in operation.get("parameters", [])
        if not parameter.get("description", "").strip()
    ]

    assert undescribed == []


@pytest.mark.parametrize(
    ("description", "summary"),
    [
        ("Create a thread. Returns the existing one when agent and external_id match.", "Create a thread"),
        ("The thread, with its head:\nand branches.", "The thread, with its head"),
        ("One sentence without a full stop", "One sentence without a full stop"),
        ("x" * 200, "x" * 119 + "…"),
    ],
)
def test_a_summary_is_the_first_sentence_of_the_description(description: str, summary: str) -> None:
    assert first_sentence(description) == summary
