"""Filter tokens become their namespace's: each stored token is XORed with its namespace's mask
(memory.filters.namespace_mask), so the GIN index finds a namespace's matches by itself. XOR
undoes itself, so the reverse is the same statement."""

from django.db import migrations

# memory.filters.MASK_SQL of namespace_id, as it was written then.
_MASK_TOKENS = (
    "UPDATE memory_item SET tokens = ARRAY(SELECT t # ('x' || left(md5((namespace_id)::text), 16))::bit(64)::bigint "
    "FROM unnest(tokens) t ORDER BY 1) WHERE tokens IS NOT NULL AND cardinality(tokens) > 0"
)


class Migration(migrations.Migration):
    dependencies = [("memory", "0003_blackboard")]

    operations = [migrations.RunSQL(_MASK_TOKENS, reverse_sql=_MASK_TOKENS)]
