"""Approval requests and decisions (issue 4 builds them on the checkpoint store)."""
