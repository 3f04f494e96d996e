"""The audit trail: one append-only entry per human action, written by every app in the same
transaction as the action (`audit.trail.record`), read on the audit page and in the admin.

Imports checkpoints (a thread's data key seals an entry's secrets); never approvals or agents."""
