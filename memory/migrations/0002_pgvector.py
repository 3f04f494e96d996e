"""pgvector where the server offers it (the embedded server from `pgserver` does): semantic search
uses it (memory.vectors); without it, search falls back to full text. A role that may not create
extensions leaves it to an administrator (`CREATE EXTENSION vector;`)."""

from django.db import migrations

CREATE = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS vector;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'pgvector is available but this role may not create it; semantic search falls back to full text';
        END;
    END IF;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("memory", "0001_initial")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=migrations.RunSQL.noop)]
