"""Downloading a thread's trajectory from its page, in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Pages, make_person
from tests.e2e.test_thread import seed_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_viewer_downloads_the_thread_as_json_lines(tab: Pages) -> None:
    make_person("vera", "viewer")
    thread = seed_conversation(steps=25)
    tab.login("vera")
    tab.goto(f"/threads/{thread.pk}/")
    tab.shot("thread page")

    with tab.page.expect_download() as download:
        tab.page.click("a:has-text('Export JSONL')")

    assert download.value.suggested_filename == f"quicksave-thread-{thread.pk}.jsonl"
    records = [json.loads(line) for line in Path(download.value.path()).read_text().splitlines()]
    assert records[0]["type"] == "thread" and records[0]["id"] == str(thread.pk)
    assert [branch["name"] for branch in records[0]["branches"]] == ["main", "cheaper-hotels"]
    assert records[-1] == {"type": "end", "checkpoints": 27}
