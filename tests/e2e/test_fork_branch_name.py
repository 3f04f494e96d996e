"""The fork form checks the branch name in the browser with the server's own rule
(checkpoints.forks.BRANCH_NAME): Chromium compiles a `pattern` with the `v` flag, under which an
unescaped `/` in a character class is a syntax error, and a pattern that does not compile checks nothing."""

from __future__ import annotations

import pytest

from checkpoints import storage
from checkpoints.forks import BRANCH_NAME
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NAMES = ["retry", "fix/batch-size", "v1.2_b", "a", "bad name", "-leading-dash", "/leading-slash", "tab\tin", "ümlaut"]


def test_the_branch_name_field_accepts_what_the_server_accepts_and_refuses_the_rest(tab: Pages) -> None:
    make_person("ada", "admin")
    thread, _ = storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-fork-form")
    first = storage.append_checkpoint(thread=thread, parent=None, state={"n": 1})
    tab.login("ada")
    tab.goto(f"/checkpoints/{first.pk}/fork/")
    field = tab.page.locator("#fork-branch")

    verdicts = {}
    for name in NAMES:
        field.fill(name)
        verdicts[name] = field.evaluate("input => !input.validity.patternMismatch")

    assert verdicts == {name: BRANCH_NAME.fullmatch(name) is not None for name in NAMES}
    assert verdicts["fix/batch-size"] and not verdicts["bad name"]
