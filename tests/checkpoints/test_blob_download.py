"""A large value's download is always an attachment whose file name the agent cannot steer: its
`external_id` names the file, but quotes, line breaks and non-ASCII characters cannot break out of
the header, make the response fail or make the browser show the value inline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from checkpoints import storage
from checkpoints.models import Blob
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db

LARGE = "x" * 5000


@pytest.fixture
def small_offload(settings: Any, tmp_path: Path) -> None:
    settings.QUICKSAVE_OFFLOAD_BYTES = 1024
    settings.STORAGES = {
        **settings.STORAGES,
        "quicksave_blobs": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path), "allow_overwrite": True},
        },
    }
    storage.clear_caches()


# An RFC 6266 header as we send it: the disposition, an ASCII token-safe fallback, the UTF-8 name.
DISPOSITION = re.compile(r"""attachment; filename="([A-Za-z0-9._-]+)"; filename\*=UTF-8''([A-Za-z0-9%._~-]+)""")


@pytest.mark.parametrize(
    ("external_id", "expected"),
    [
        ('report.html"; x="', "report.html__ x=_"),
        ("run\r\nSet-Cookie: stolen=1", "run__Set-Cookie_ stolen=1"),
        ("réservation-東京", "réservation-東京"),
        ("../../etc/passwd", ".._.._etc_passwd"),
        ("plain-id", "plain-id"),
    ],
)
def test_a_large_value_downloads_as_an_attachment_named_safely_whatever_the_external_id(
    agent: Agent, small_offload: None, external_id: str, expected: str
) -> None:
    thread, _ = storage.create_thread(agent=agent, external_id=external_id)
    storage.append_checkpoint(thread=thread, parent=None, state={"notes": LARGE})
    digest = Blob.objects.get(thread=thread).sha256
    viewer = signed_in(person("vic", "viewer"))

    download = viewer.get(f"/threads/{thread.pk}/blobs/{digest}/")

    assert download.status_code == 200 and download.content.decode() == LARGE
    assert download["X-Content-Type-Options"] == "nosniff"
    header = download["Content-Disposition"]
    match = DISPOSITION.fullmatch(header)
    assert match, header
    fallback, encoded = match.groups()
    assert unquote(encoded) == f"{expected}-{digest[:12]}.txt"
    assert fallback.endswith(f"-{digest[:12]}.txt") and fallback.isascii()
    assert "\r" not in header and "\n" not in header


def test_a_very_long_external_id_gives_a_shortened_file_name(agent: Agent, small_offload: None) -> None:
    thread, _ = storage.create_thread(agent=agent, external_id="é" * 255)
    storage.append_checkpoint(thread=thread, parent=None, state={"notes": LARGE})
    digest = Blob.objects.get(thread=thread).sha256

    download = signed_in(person("vic", "viewer")).get(f"/threads/{thread.pk}/blobs/{digest}/")

    match = DISPOSITION.fullmatch(download["Content-Disposition"])
    assert match, download["Content-Disposition"]
    assert unquote(match.group(2)) == "é" * 100 + f"-{digest[:12]}.txt"
    assert len(download["Content-Disposition"]) < 1000
