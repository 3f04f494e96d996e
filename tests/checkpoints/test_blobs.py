"""Large values: offloaded to blob storage once per thread, restored transparently, shown by a
preview with a permission-checked download, collected when unreferenced; on the filesystem
and on a real S3-compatible server (moto's standalone server in its own process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from checkpoints import storage
from checkpoints.models import Blob, Checkpoint, Thread
from checkpoints.storage import blobs, crypto, garbage
from checkpoints.storage.errors import IntegrityFailure
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in
from tests.processes import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 4096
ATTACHMENT = "PDF-bytes-as-text " * 1000  # 18,000 characters, well above the limit
REPORT = {"pages": [{"n": n, "text": f"page {n} " * 40} for n in range(30)]}  # an object above it


@pytest.fixture
def filesystem_blobs(settings: Any, tmp_path: Path) -> Path:
    settings.QUICKSAVE_OFFLOAD_BYTES = LIMIT
    settings.STORAGES = {
        **settings.STORAGES,
        "quicksave_blobs": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path), "allow_overwrite": True},
        },
    }
    storage.clear_caches()
    return tmp_path


def fresh_process() -> None:
    storage.clear_caches()
    crypto.forget_keys()


def payload_bytes(thread: Thread) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT length(payload) FROM checkpoints_checkpoint WHERE thread_id = %s ORDER BY seq",
                       [thread.pk])  # fmt: skip
        return [row[0] for row in cursor.fetchall()]


def write_attachment_thread(agent: Agent, settings: Any, steps: int = 6) -> tuple[Thread, list[Checkpoint]]:
    settings.QUICKSAVE_SNAPSHOT_EVERY = 2  # snapshots repeat the attachment: it must still be stored once
    thread, _ = storage.create_thread(agent=agent)
    head = storage.append_checkpoint(thread=thread, parent=None, state={"files": {"contract.pdf": ATTACHMENT}, "n": 0})
    written = [head]
    for n in range(1, steps):
        head = storage.append_checkpoint(
            thread=thread, parent=head, patch=[{"op": "replace", "path": "/n", "value": n}]
        )
        written.append(head)
    head = storage.append_checkpoint(
        thread=thread, parent=head, patch=[{"op": "add", "path": "/report", "value": REPORT}]
    )
    return thread, [*written, head]


def test_large_values_are_stored_once_and_restored_transparently(
    agent: Agent, settings: Any, filesystem_blobs: Path
) -> None:
    thread, written = write_attachment_thread(agent, settings)

    assert Blob.objects.filter(thread=thread).count() == 2  # the attachment once, the report once
    assert sorted(Blob.objects.filter(thread=thread).values_list("type", flat=True)) == ["object", "string"]
    files = [path for path in filesystem_blobs.rglob("*") if path.is_file()]
    assert len(files) == 2 and all(b"PDF-bytes" not in path.read_bytes() for path in files)  # sealed
    assert max(payload_bytes(thread)) < 2000  # checkpoints keep references, not the values
    fresh_process()
    assert storage.state_at(written[3].pk) == {"files": {"contract.pdf": ATTACHMENT}, "n": 3}
    assert storage.state_at(written[-1].pk)["report"] == REPORT
    raw = storage.decode_payload(Checkpoint.objects.get(pk=written[0].pk), restore=False)
    reference = raw["files"]["contract.pdf"]["$qs_blob"]
    assert reference["size"] == len(ATTACHMENT) + 2 and reference["preview"].startswith("PDF-bytes-as-text")


def test_an_altered_blob_fails_its_check(agent: Agent, settings: Any, filesystem_blobs: Path) -> None:
    thread, written = write_attachment_thread(agent, settings, steps=2)
    digest = Blob.objects.get(thread=thread, type="string").sha256
    target = filesystem_blobs / blobs.blob_name(thread.pk, digest)
    target.write_bytes(target.read_bytes()[:-1] + b"\x00")
    fresh_process()
    with pytest.raises(IntegrityFailure):
        storage.state_at(written[0].pk)


def test_the_checkpoint_page_shows_a_preview_and_a_permission_checked_download(
    agent: Agent, settings: Any, filesystem_blobs: Path, foreign_client: Client
) -> None:
    thread, written = write_attachment_thread(agent, settings, steps=2)
    digest = Blob.objects.get(thread=thread, type="string").sha256
    viewer = signed_in(person("vic", "viewer"))
    page = viewer.get(f"/checkpoints/{written[0].pk}/").content.decode()
    link = f"/threads/{thread.pk}/blobs/{digest}/"
    assert 'id="large-values"' in page and link in page and "/files/contract.pdf" in page
    assert ATTACHMENT not in page  # the tree and raw view show a placeholder, not 18 KB

    download = viewer.get(link)
    assert download.status_code == 200 and download.content.decode() == ATTACHMENT
    assert download["Content-Disposition"].startswith("attachment;")
    assert Client().get(link).status_code == 302  # to the sign-in page
    assert foreign_client.get(link).status_code in (302, 404)
    assert viewer.get(f"/threads/{thread.pk}/blobs/{'0' * 64}/").status_code == 404


def test_prune_collects_blobs_of_deleted_threads_and_leaves_other_installations_alone(
    agent: Agent, settings: Any, filesystem_blobs: Path
) -> None:
    gone, _ = write_attachment_thread(agent, settings, steps=2)
    keep, _ = write_attachment_thread(agent, settings, steps=2)
    # A file of a live thread with no row (a write that rolled back after its upload), and the
    # folder of a thread another installation sharing this storage wrote.
    orphan = filesystem_blobs / "t" / str(keep.pk) / "orphan"
    orphan.write_bytes(b"sealed")
    stranger = filesystem_blobs / "t" / "01a20000-0000-7000-8000-000000000001"
    stranger.mkdir()
    (stranger / "theirs").write_bytes(b"sealed")
    storage.delete_thread(gone)

    assert garbage.collect_garbage(grace_seconds=3600).files == 2  # the deleted thread's; the orphan is too recent
    assert not (filesystem_blobs / "t" / str(gone.pk)).exists() or not any(
        (filesystem_blobs / "t" / str(gone.pk)).iterdir()
    )
    dry = garbage.collect_garbage(dry_run=True, grace_seconds=0)
    assert dry.files == 1 and orphan.exists()
    assert garbage.collect_garbage(grace_seconds=0).files == 1
    assert not orphan.exists() and (stranger / "theirs").exists()
    kept = [p for p in (filesystem_blobs / "t" / str(keep.pk)).iterdir()]
    assert len(kept) == 2
    fresh_process()
    assert storage.latest_state(thread=keep)[1]["files"]["contract.pdf"] == ATTACHMENT


def test_an_unreferenced_blob_is_collected_only_once_no_write_has_used_it_lately(
    agent: Agent, filesystem_blobs: Path
) -> None:
    thread, _ = storage.create_thread(agent=agent)
    # A write in flight stored its large value; its checkpoint is not committed (yet, or ever).
    blobs.offload(thread.pk, {"draft": ATTACHMENT})
    digest = Blob.objects.get(thread=thread).sha256
    file = filesystem_blobs / blobs.blob_name(thread.pk, digest)

    assert garbage.collect_garbage(grace_seconds=3600).rows == 0 and file.exists()
    Blob.objects.filter(thread=thread).update(used_at=timezone.now() - timedelta(hours=2))
    blobs.offload(thread.pk, {"retry": ATTACHMENT})  # the agent's retry reuses the stored value
    assert garbage.collect_garbage(grace_seconds=3600).rows == 0 and file.exists()

    Blob.objects.filter(thread=thread).update(used_at=timezone.now() - timedelta(hours=2))
    assert garbage.collect_garbage(grace_seconds=3600).rows == 1
    assert not file.exists() and not Blob.objects.filter(thread=thread).exists()


# --------------------------------------------------------------------------- S3


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    if importlib.util.find_spec("moto") is None:
        pytest.fail("moto is not installed: pip install -r requirements-dev.txt", pytrace=False)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert process.poll() is None, f"moto's S3 server exited ({process.returncode})"
        try:
            httpx.get(url, timeout=1)
        except httpx.HTTPError:
            return False
        return True

    try:
        wait_until(answers, what=f"moto's S3 server to answer at {url}")
    except BaseException:
        process.kill()
        raise
    yield url
    process.terminate()
    process.wait(10)


def test_blobs_go_to_an_s3_compatible_server(agent: Agent, settings: Any, s3_server: str) -> None:
    import boto3

    credentials = {"aws_access_key_id": "quicksave", "aws_secret_access_key": "quicksave-secret"}
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", **credentials)
    s3.create_bucket(Bucket="quicksave-blobs")
    settings.QUICKSAVE_OFFLOAD_BYTES = LIMIT
    settings.STORAGES = {
        **settings.STORAGES,
        "quicksave_blobs": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": "quicksave-blobs", "endpoint_url": s3_server, "region_name": "us-east-1",
                "access_key": credentials["aws_access_key_id"], "secret_key": credentials["aws_secret_access_key"],
                "location": "qs", "file_overwrite": True, "default_acl": None,
            },
        },
    }  # fmt: skip
    thread, written = write_attachment_thread(agent, settings, steps=4)

    keys = [item["Key"] for item in s3.list_objects_v2(Bucket="quicksave-blobs").get("Contents", [])]
    assert len(keys) == 2 and all(key.startswith(f"qs/t/{thread.pk}/") for key in keys)
    body = s3.get_object(Bucket="quicksave-blobs", Key=keys[0])["Body"].read()
    assert b"PDF-bytes" not in body and b"page 1" not in body
    fresh_process()
    assert storage.state_at(written[2].pk)["files"]["contract.pdf"] == ATTACHMENT

    storage.delete_thread(thread)
    assert garbage.collect_garbage(grace_seconds=0).files == 2
    assert s3.list_objects_v2(Bucket="quicksave-blobs").get("KeyCount") == 0
