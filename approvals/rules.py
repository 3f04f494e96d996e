"""Auto-approve rules: the routine requests an admin approves in advance.

A rule names an action (and optionally an agent), conditions on the args (simple comparisons on
JSON Pointers, a JSON Schema, or both), a risk ceiling and an expiry. The one way in for rule
writes (`create_rule`, `revoke_rule`, both audited), the check a new request goes through
(`matching_rule`, which reads the table under a share lock, so a revocation that has returned
stops every later match: no cache stands between them) and `suggest_rule`, which proposes a rule
from the last identical human approvals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import jsonschema
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus, AutoApproveRule, Risk
from audit import trail
from checkpoints.storage import codec
from quicksave.errors import DomainError
from quicksave_agents.models import Agent

OPS = ("eq", "ne", "lt", "le", "gt", "ge", "in")
RISK_ORDER: dict[str, int] = {Risk.LOW.value: 0, Risk.MEDIUM.value: 1, Risk.HIGH.value: 2}
MAX_CONDITIONS = 50
# How many identical human approvals a suggestion looks back over, at most.
MAX_SUGGEST_LOOKBACK = 100


class InvalidRule(DomainError):
    """A rule that cannot be: `detail.fields` names each field and what is wrong, as the API's
    other field errors do; a condition's problem is under `conditions` with its index."""

    code = "invalid"
    status = 400


class RuleRevoked(DomainError):
    code = "rule_revoked"
    status = 409


def _invalid(name: str, message: str) -> InvalidRule:
    return InvalidRule(message, detail={"fields": {name: [message]}})


def check_conditions(conditions: Any) -> list[dict[str, Any]]:
    """The conditions as stored, or InvalidRule naming the first bad one (`conditions[2].op`)."""
    if not isinstance(conditions, list):
        raise _invalid("conditions", "`conditions` must be a list of {path, op, value}.")
    if len(conditions) > MAX_CONDITIONS:
        raise _invalid("conditions", f"A rule has at most {MAX_CONDITIONS} conditions.")
    checked = []
    for index, condition in enumerate(conditions):
        where = f"conditions[{index}]"
        if not isinstance(condition, dict) or set(condition) != {"path", "op", "value"}:
            raise _invalid("conditions", f"{where} must be an object with exactly `path`, `op` and `value`.")
        path, op, value = condition["path"], condition["op"], condition["value"]
        if not isinstance(path, str) or (path and not path.startswith("/")):
            raise _invalid("conditions", f"{where}.path must be a JSON Pointer: \"\" for the whole args, "
                                         "or /key/0/... into them.")  # fmt: skip
        if op not in OPS:
            raise _invalid("conditions", f"{where}.op must be one of {', '.join(OPS)}.")
        if op == "in" and not isinstance(value, list):
            raise _invalid("conditions", f"{where}.value must be a list for `in`.")
        if op in ("lt", "le", "gt", "ge") and not (_is_number(value) or isinstance(value, str)):
            raise _invalid("conditions", f"{where}.value must be a number or a string for `{op}`.")
        try:
            codec.check_depth(value)
            codec.to_canonical_bytes(value)
        except codec.EncodingError as exc:
            raise _invalid("conditions", f"{where}.value {exc}.") from None
        checked.append({"path": path, "op": op, "value": value})
    return checked


def check_schema(schema: Any) -> None:
    if schema is None:
        return
    if not isinstance(schema, (dict, bool)):
        raise _invalid("args_schema", "`args_schema` must be a JSON Schema (an object) or null.")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(part) for part in exc.path)
        raise _invalid("args_schema", f"`args_schema` is not a valid JSON Schema at {where}: {exc.message}") from None


def create_rule(
    *,
    name: str,
    agent: Agent | None,
    action: str,
    conditions: Sequence[dict[str, Any]] = (),
    args_schema: Any = None,
    max_risk: str = Risk.LOW,
    expires_at: datetime | None = None,
    actor: User,
    address: str | None = None,
) -> AutoApproveRule:
    """A live rule, audited. It decides matching requests filed from now on (not those waiting)."""
    name = (name or "").strip()
    if not name or len(name) > 100 or "\x00" in name:
        raise _invalid("name", "`name` must be 1 to 100 characters, without NUL.")
    action = (action or "").strip()
    if not action or len(action) > 200 or "\x00" in action:
        raise _invalid("action", "`action` must be 1 to 200 characters, without NUL.")
    checked = check_conditions(list(conditions))
    check_schema(args_schema)
    if not checked and args_schema is None:
        raise _invalid("conditions", "A rule needs at least one condition or an `args_schema`: without either it "
                                     "would approve every request for the action.")  # fmt: skip
    if max_risk not in RISK_ORDER:
        raise _invalid("max_risk", f"`max_risk` must be one of {', '.join(Risk.values)}.")
    if expires_at is not None and expires_at <= timezone.now():
        raise _invalid("expires_at", "`expires_at` must be in the future.")
    with transaction.atomic():
        rule = AutoApproveRule.objects.create(
            name=name, agent=agent, action=action, conditions=checked, args_schema=args_schema, max_risk=max_risk,
            expires_at=expires_at, created_by=actor,
        )  # fmt: skip
        trail.record(actor=actor, action="rule.create", target_type="auto_approve_rule", target_id=rule.pk,
                     after=describe(rule), address=address)  # fmt: skip
    return rule


def revoke_rule(*, rule: AutoApproveRule, actor: User, reason: str = "", address: str | None = None) -> AutoApproveRule:
    """Stop the rule: once this returns, no request matches it. A request whose match is being
    committed at that moment holds the rule's row (`matching_rule`), so the revocation waits
    for it and is never overtaken by it."""
    reason = (reason or "").strip()
    if "\x00" in reason:
        raise _invalid("reason", "The reason cannot hold a NUL character.")
    with transaction.atomic():
        locked = AutoApproveRule.objects.select_for_update(of=("self",)).select_related("agent").get(pk=rule.pk)
        if locked.revoked_at is not None:
            raise RuleRevoked(f"Rule “{locked.name}” was revoked already, at {locked.revoked_at:%Y-%m-%d %H:%M:%S %Z}.")
        locked.revoked_at = timezone.now()
        locked.revoked_by = actor
        locked.revoke_reason = reason
        locked.save(update_fields=["revoked_at", "revoked_by", "revoke_reason"])
        trail.record(actor=actor, action="rule.revoke", target_type="auto_approve_rule", target_id=locked.pk,
                     reason=reason, before=describe(rule), after={"revoked": True}, address=address)  # fmt: skip
    return locked


def describe(rule: AutoApproveRule) -> dict[str, Any]:
    return {
        "name": rule.name,
        "agent": rule.agent.name if rule.agent_id and rule.agent else None,
        "action": rule.action,
        "conditions": rule.conditions,
        "args_schema": rule.args_schema,
        "max_risk": rule.max_risk,
        "expires_at": rule.expires_at.isoformat() if rule.expires_at else None,
    }


def matching_rule(approval: ApprovalRequest, *, now: datetime | None = None) -> AutoApproveRule | None:
    """The oldest live rule that approves `approval`, or None. Call inside the transaction that files
    it: the rule's row stays share-locked until that commits, which a revocation waits for."""
    if approval.kind != ApprovalKind.APPROVAL or approval.unreadable:
        return None
    now = now or timezone.now()
    candidates = (
        AutoApproveRule.objects.filter(action=approval.action, revoked_at__isnull=True)
        .filter(Q(agent_id=approval.thread.agent_id) | Q(agent__isnull=True))
        .exclude(expires_at__lte=now)
        .order_by("created_at", "id")
    )
    for rule in candidates:
        if matches(rule, args=approval.args, risk=approval.risk) and _still_live(rule.pk, now):
            return rule
    return None


def _still_live(rule_id: int, now: datetime) -> bool:
    # FOR SHARE: a revocation in flight is waited for (and then this sees it revoked); one that
    # starts after this waits for the request's transaction. Django's select_for_update has no
    # share mode, hence the one statement of SQL.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM approvals_autoapproverule WHERE id = %s AND revoked_at IS NULL "
            "AND (expires_at IS NULL OR expires_at > %s) FOR SHARE",
            [rule_id, now],
        )
        return cursor.fetchone() is not None


def matches(rule: AutoApproveRule, *, args: Any, risk: str) -> bool:
    """Whether `args` at `risk` pass the rule's risk ceiling, schema and every condition."""
    if RISK_ORDER.get(risk, 99) > RISK_ORDER.get(rule.max_risk, -1):
        return False
    if rule.args_schema is not None and not jsonschema.Draft202012Validator(rule.args_schema).is_valid(args):
        return False
    return all(_holds(condition, args) for condition in rule.conditions)


_MISSING = object()


def _holds(condition: dict[str, Any], args: Any) -> bool:
    found = _resolve(args, condition["path"])
    if found is _MISSING:
        return False
    op, value = condition["op"], condition["value"]
    if op == "eq":
        return _same(found, value)
    if op == "ne":
        return not _same(found, value)
    if op == "in":
        return any(_same(found, item) for item in value)
    comparable = (_is_number(found) and _is_number(value)) or (isinstance(found, str) and isinstance(value, str))
    if not comparable:
        return False
    return {"lt": found < value, "le": found <= value, "gt": found > value, "ge": found >= value}[op]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `true` is not `1`, and 1 is 1.0."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return codec.to_canonical_bytes(a) == codec.to_canonical_bytes(b)


def _resolve(document: Any, pointer: str) -> Any:
    """The value at an RFC 6901 JSON Pointer, or _MISSING."""
    if pointer == "":
        return document
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            if token not in current:
                return _MISSING
            current = current[token]
        elif isinstance(current, list):
            if not token.isdigit() or (len(token) > 1 and token.startswith("0")) or int(token) >= len(current):
                return _MISSING
            current = current[int(token)]
        else:
            return _MISSING
    return current


@dataclass(frozen=True)
class Suggestion:
    """A rule proposed from `based_on` identical human approvals, or the reason there is none."""

    agent: str
    action: str
    conditions: list[dict[str, Any]]
    max_risk: str
    based_on: list[str]  # the approvals' ids, newest first
    reason: str = ""  # why no rule is proposed; empty when one is


def suggest_rule(*, agent: Agent, action: str, last: int = 5) -> Suggestion:
    """Propose a rule when the last `last` human decisions on `agent`'s `action` were all approvals,
    unedited, of identical args: one `eq` condition per top-level key (the whole args when they are
    no object), and the highest risk among them as the ceiling."""
    if not 2 <= last <= MAX_SUGGEST_LOOKBACK:
        raise _invalid("last", f"`last` must be from 2 to {MAX_SUGGEST_LOOKBACK}.")
    decided = list(
        ApprovalRequest.objects.filter(
            thread__agent=agent, action=action, kind=ApprovalKind.APPROVAL,
            status__in=[ApprovalStatus.APPROVED, ApprovalStatus.REJECTED], decided_by__isnull=False,
        ).order_by("-decided_at")[:last]
    )  # fmt: skip
    empty = Suggestion(agent=agent.name, action=action, conditions=[], max_risk=Risk.LOW, based_on=[])

    def none(reason: str) -> Suggestion:
        return replace(empty, reason=reason)

    if len(decided) < last:
        return none(f"People decided {len(decided)} of {agent.name}'s {action} requests; a suggestion needs {last}.")
    if any(approval.status != ApprovalStatus.APPROVED for approval in decided):
        return none(f"Among the last {last} human decisions on {action}, some were rejections.")
    if any(approval.args_edited or approval.unreadable for approval in decided):
        return none(f"Among the last {last} approvals of {action}, some had edited or unreadable arguments.")
    first = codec.to_canonical_bytes(decided[0].args)
    if any(codec.to_canonical_bytes(approval.args) != first for approval in decided[1:]):
        return none(f"The last {last} approvals of {action} had different arguments.")
    args = decided[0].args
    if isinstance(args, dict) and args:
        conditions = [{"path": "/" + key.replace("~", "~0").replace("/", "~1"), "op": "eq", "value": value}
                      for key, value in sorted(args.items())]  # fmt: skip
    else:
        conditions = [{"path": "", "op": "eq", "value": args}]
    risk = max((approval.risk for approval in decided), key=lambda value: RISK_ORDER.get(value, 0))
    return Suggestion(agent=agent.name, action=action, conditions=conditions, max_risk=risk,
                      based_on=[str(approval.pk) for approval in decided])  # fmt: skip
