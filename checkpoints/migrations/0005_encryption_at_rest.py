"""Encryption at rest: a wrapped data key per thread, and tool results stored sealed.

Existing tool results become plain frames (0x00 + their JSON), which read as before;
new ones are sealed under their thread's data key.
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import checkpoints.fields


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0004_status_labels'),
    ]

    operations = [
        migrations.CreateModel(
            name='ThreadKey',
            fields=[
                ('thread', models.OneToOneField(
                    on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+',
                    serialize=False, to='checkpoints.thread',
                )),
                ('master_key_id', models.CharField(max_length=32)),
                ('wrapped', models.BinaryField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('rotated_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='toolresult',
                    name='result',
                    field=checkpoints.fields.SealedJSONField(bind=('thread_id', 'key')),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql="ALTER TABLE checkpoints_toolresult ALTER COLUMN result TYPE bytea "
                        "USING ('\\x00'::bytea || convert_to(result::text, 'UTF8'))",
                    reverse_sql="ALTER TABLE checkpoints_toolresult ALTER COLUMN result TYPE jsonb "
                                "USING convert_from(substring(result from 2), 'UTF8')::jsonb",
                ),
            ],
        ),
    ]
