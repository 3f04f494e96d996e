"""Notifications: tell people where they are that an agent waits on them.

Owns the channels admins configure (an outbound webhook, a Slack-compatible incoming webhook, an
email list), what each subscribes to, the deliveries made to them (retried with backoff, kept in
PostgreSQL) and the signed links a message carries to decide an approval from it.

It reads the event log and approvals through their public surface (`checkpoints.models.Event`,
`approvals.models`, `approvals.services.decide`) and writes nothing of theirs. Nothing in the core
(`quicksave`, `checkpoints`, `approvals`, `quicksave_agents`, `audit`) imports it: events reach it
through a trigger on the event table (see `migrations/0001_initial.py`), and its dispatcher is
started through `quicksave.background`.
"""
