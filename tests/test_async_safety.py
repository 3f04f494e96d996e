"""Django's async-safety check is on for the suite: no test (the browser tests included, which
lift it for themselves while they run) leaves it off for the tests after it.

No database: pytest-django runs the tests that need none last, after the browser tests."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import SynchronousOnlyOperation


@pytest.mark.asyncio
async def test_a_blocking_orm_call_from_async_code_is_refused() -> None:
    with pytest.raises(SynchronousOnlyOperation):
        User.objects.count()
