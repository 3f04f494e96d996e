"""An index of memory_indexentry by (namespace, dims): the exact branch of a vector search under a
narrow prefix read every entry of the table (memory.selectors._near_sql). Built concurrently, so
writers of items are not held up while it builds."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memory", "0005_item_reads"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="indexentry",
            index=models.Index(fields=["namespace", "dims"], name="memory_index_namespace"),
        ),
    ]
