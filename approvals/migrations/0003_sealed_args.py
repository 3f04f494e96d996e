"""Approval args stored sealed under their thread's data key.

Existing args become plain frames (0x00 + their JSON), which read as before.
"""

from django.db import migrations

import checkpoints.fields

TO_BYTEA = "ALTER COLUMN {0} TYPE bytea USING ('\\x00'::bytea || convert_to({0}::text, 'UTF8'))"
TO_JSONB = "ALTER COLUMN {0} TYPE jsonb USING convert_from(substring({0} from 2), 'UTF8')::jsonb"


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0002_audit_entry'),
        ('checkpoints', '0005_encryption_at_rest'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='approvalrequest',
                    name='args',
                    field=checkpoints.fields.SealedJSONField(bind=('pk',), default=dict),
                ),
                migrations.AlterField(
                    model_name='approvalrequest',
                    name='decided_args',
                    field=checkpoints.fields.SealedJSONField(bind=('pk',), blank=True, null=True),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql="ALTER TABLE approvals_approvalrequest "
                        + ", ".join(TO_BYTEA.format(column) for column in ("args", "decided_args")),
                    reverse_sql="ALTER TABLE approvals_approvalrequest "
                                + ", ".join(TO_JSONB.format(column) for column in ("args", "decided_args")),
                ),
            ],
        ),
    ]
