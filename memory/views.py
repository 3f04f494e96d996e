"""The memory browser: namespaces as a tree, items with search, an item's versions with what each
changed and where it was written from, and the threads that read it; admins edit an item or roll
it back, with a reason. Open pages follow the items they show (static/js/memory.js)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from audit.trail import client_address
from checkpoints.storage.jsonpatch import make_patch
from memory import edits, selectors
from memory.access import EVERYTHING, VIEW, WRITE
from memory.errors import MemoryStoreError, VersionConflict
from memory.paths import MAX_KEY, MAX_LABEL, Path, item_key, namespace_path
from quicksave.jsontext import loads_strict
from quicksave_agents.models import Agent

PAGE = 50
HISTORY = 50
NAMESPACES = 1000  # the tree lists at most this many; deeper ones are reached by search
SHOWN_CHARS = 300


def _viewer(view: Any) -> Any:
    return login_required(permission_required(VIEW, raise_exception=True)(view))


class BrowseForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Words in indexed fields")
    page = forms.IntegerField(required=False, min_value=1, max_value=10_000)


@dataclass(frozen=True)
class TreeNode:
    label: str
    depth: int
    query: str  # the page's query string selecting this namespace
    selected: bool


def _labels(request: HttpRequest) -> Path:
    """The namespace the page is about (`ns`, once per label); 404 for one no namespace can be."""
    labels = request.GET.getlist("ns")
    if any(len(label) > MAX_LABEL for label in labels):
        raise Http404(f"A namespace label is at most {MAX_LABEL} characters.")
    try:
        return namespace_path(labels, allow_empty=True)
    except MemoryStoreError as exc:
        raise Http404(exc.message) from None


def _query(path: Path, **extra: Any) -> str:
    return urlencode([("ns", label) for label in path] + [(k, v) for k, v in extra.items() if v not in (None, "")])


def tree(paths: list[Path], selected: Path) -> list[TreeNode]:
    """Every namespace and each of its prefixes once, in order, indented by depth."""
    prefixes = sorted({path[:depth] for path in paths for depth in range(1, len(path) + 1)})
    return [TreeNode(p[-1], len(p) - 1, _query(p), p == selected) for p in prefixes]


def _live_query(path: Path, key: str | None = None) -> str:
    """The query of the page's socket (memory.consumers.PageConsumer): what it shows, as of now
    (taken before the page reads, so a write it may have missed counts as a change)."""
    return _query(path, key=key, since=timezone.now().isoformat())


@_viewer
def browse(request: HttpRequest) -> HttpResponse:
    path = _labels(request)
    live_query = _live_query(path)
    form = BrowseForm(request.GET)
    if not form.is_valid():
        return render(request, "memory/browse.html", {"nav": "memory", "form": form, "path": path}, status=400)
    page = form.cleaned_data["page"] or 1
    query = form.cleaned_data["q"].strip()
    try:
        found = selectors.search_items(scope=EVERYTHING, prefix=path, query=query or None, limit=PAGE + 1,
                                       offset=(page - 1) * PAGE)  # fmt: skip
    except MemoryStoreError as exc:
        form.add_error("q", exc.message)
        found = []
    if query:  # a text search ranks the matches first, then lists the rest: show the matches only
        found = [item for item in found if item.score]
    context = {
        "nav": "memory",
        "form": form,
        "path": path,
        "crumbs": [(label, _query(path[: i + 1])) for i, label in enumerate(path)],
        "tree": tree(selectors.list_namespaces(scope=EVERYTHING, limit=NAMESPACES), path),
        "items": [(item, _query(item.namespace, key=item.key), _short(item.value)) for item in found[:PAGE]],
        "query": query,
        "page": page,
        "previous_query": _query(path, q=query, page=page - 1 if page > 2 else None) if page > 1 else None,
        "next_query": _query(path, q=query, page=page + 1) if len(found) > PAGE else None,
        "live_query": live_query,
    }
    return render(request, "memory/browse.html", context)


class EditForm(forms.Form):
    value = forms.CharField(widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}), label="Value (JSON)")
    reason = forms.CharField(max_length=edits.MAX_REASON, label="Why")
    seen_version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)

    def clean_value(self) -> Any:
        try:
            return loads_strict(self.cleaned_data["value"])
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from None


class RollbackForm(forms.Form):
    to_version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    reason = forms.CharField(max_length=edits.MAX_REASON, label="Why")
    seen_version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)


@dataclass(frozen=True)
class Change:
    op: str
    path: str
    before: str
    after: str


@dataclass(frozen=True)
class VersionRow:
    version: selectors.Version
    writer: str
    changes: list[Change]
    shown: str


def _item_key(request: HttpRequest) -> str:
    key = request.GET.get("key", "")
    if len(key) > MAX_KEY:
        raise Http404(f"An item key is at most {MAX_KEY} characters.")
    try:
        return item_key(key)
    except MemoryStoreError as exc:
        raise Http404(exc.message) from None


@_viewer
def item(request: HttpRequest) -> HttpResponse:
    path, key = _labels(request), _item_key(request)
    live_query = _live_query(path, key)
    current = selectors.get_item(namespace=path, key=key, scope=EVERYTHING)
    history = selectors.item_history(namespace=path, key=key, scope=EVERYTHING, limit=HISTORY + 1)
    if history is None:
        raise Http404(f"There is no item {key!r} in {'/'.join(path) or 'the root namespace'}.")
    user = request.user
    can_change = isinstance(user, User) and user.has_perm(WRITE)
    edit_form = EditForm(initial={"value": _pretty(current.value) if current else "",
                                  "seen_version": history[0].version if history else 1})  # fmt: skip
    if request.method == "POST":
        if not (can_change and isinstance(user, User)):
            raise PermissionDenied("Changing memory needs the admin role.")
        edit_form = EditForm(request.POST)
        if edit_form.is_valid():
            try:
                written = edits.edit_item(namespace=path, key=key, value=edit_form.cleaned_data["value"],
                                          user=user, reason=edit_form.cleaned_data["reason"],
                                          seen_version=edit_form.cleaned_data["seen_version"],
                                          address=client_address(request))  # fmt: skip
            except VersionConflict as exc:
                edit_form.add_error(None, f"{exc.message} Someone changed it meanwhile: read the new version first.")
            except MemoryStoreError as exc:
                edit_form.add_error(exc.detail.get("field") if exc.detail.get("field") in edit_form.fields else None,
                                    exc.message)  # fmt: skip
            else:
                messages.success(request, f"Saved as version {written.version}.")
                return redirect(f"{request.path}?{_query(path, key=key)}")
    rows = _rows(history[:HISTORY])
    read_by = selectors.item_reads(namespace=path, key=key, scope=EVERYTHING, limit=HISTORY)
    context = {
        "nav": "memory",
        "path": path,
        "key": key,
        "crumbs": [(label, _query(path[: i + 1])) for i, label in enumerate(path)],
        "current": current,
        "current_json": _pretty(current.value) if current else None,
        "rows": rows,
        "more": len(history) > HISTORY,
        "read_by": read_by,
        "can_change": can_change,
        "edit_form": edit_form,
        "here": _query(path, key=key),
        "live_query": live_query,
    }
    return render(request, "memory/item.html", context, status=400 if edit_form.errors else 200)


@_viewer
def rollback(request: HttpRequest) -> HttpResponse:
    """Confirm going back to an earlier version (it is written again as the newest), with a reason."""
    path, key = _labels(request), _item_key(request)
    user = request.user
    if not (isinstance(user, User) and user.has_perm(WRITE)):
        raise PermissionDenied("Changing memory needs the admin role.")
    history = selectors.item_history(namespace=path, key=key, scope=EVERYTHING, limit=1)
    if not history:
        raise Http404(f"There is no item {key!r} in {'/'.join(path) or 'the root namespace'}.")
    form = RollbackForm(request.POST or None, initial={"to_version": request.GET.get("to"),
                                                       "seen_version": history[0].version})  # fmt: skip
    if request.method == "POST" and form.is_valid():
        try:
            written = edits.roll_back_item(namespace=path, key=key, to_version=form.cleaned_data["to_version"],
                                           user=user, reason=form.cleaned_data["reason"],
                                           seen_version=form.cleaned_data["seen_version"],
                                           address=client_address(request))  # fmt: skip
        except VersionConflict as exc:
            form.add_error(None, f"{exc.message} Someone changed it meanwhile: look again before going back.")
        except MemoryStoreError as exc:
            form.add_error(None, exc.message)
        else:
            restored = form.cleaned_data["to_version"]
            messages.success(request, f"Version {restored} is back, as version {written.version}.")
            return redirect(f"/memory/item/?{_query(path, key=key)}")
    target = _target_version(request, form, path, key)
    context = {
        "nav": "memory",
        "path": path,
        "key": key,
        "form": form,
        "target": target,
        "target_json": _pretty(target.value) if target and not target.deleted else None,
        "current_version": history[0].version,
        "back": f"/memory/item/?{_query(path, key=key)}",
    }
    return render(request, "memory/rollback.html", context, status=400 if form.errors else 200)


def _target_version(request: HttpRequest, form: RollbackForm, path: Path, key: str) -> selectors.Version | None:
    raw = form.data.get("to_version") if form.is_bound else request.GET.get("to")
    try:
        number = int(raw or "")
    except ValueError:
        raise Http404("Say which version to go back to (`to`).") from None
    versions = selectors.item_history(namespace=path, key=key, scope=EVERYTHING, limit=1, before=number + 1)
    if not versions or versions[0].version != number:
        raise Http404(f"The item has no version {number}.")
    return versions[0]


def _rows(history: list[selectors.Version]) -> list[VersionRow]:
    """Each version with who wrote it and what it changed from the version before it (the oldest
    shown, if older ones are not, against nothing)."""
    agents = dict(Agent.objects.filter(pk__in={v.agent_id for v in history if v.agent_id}).values_list("pk", "name"))
    people = dict(User.objects.filter(pk__in={v.user_id for v in history if v.user_id}).values_list("pk", "username"))
    rows = []
    for index, version in enumerate(history):
        oldest_shown = index + 1 == len(history)
        if version.writer == "agent" and version.agent_id is not None:
            writer = f"agent {agents.get(version.agent_id, version.agent_id)}"
        elif version.writer == "person" and version.user_id is not None:
            writer = people.get(version.user_id, f"person {version.user_id}")
        else:
            writer = f"{version.writer} {version.rule}".strip()
        changes = [] if oldest_shown else _changes(history[index + 1].value, version.value)
        rows.append(VersionRow(version, writer, changes, _short(version.value)))
    return rows


def _changes(before: Any, after: Any) -> list[Change]:
    if before is None or after is None or not isinstance(before, dict | list) or not isinstance(after, dict | list):
        return [] if before == after else [Change("replace", "", _short(before), _short(after))]
    changes = []
    for op in make_patch(before, after):
        old = _short(_at(before, op["path"])) if op["op"] != "add" else ""
        new = _short(op.get("value")) if op["op"] != "remove" else ""
        changes.append(Change(op["op"], op["path"], old, new))
    return changes


def _at(document: Any, pointer: str) -> Any:
    """The value at an RFC 6901 pointer (None where there is none)."""
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(document, dict):
            document = document.get(token)
        elif isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        else:
            return None
    return document


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)
