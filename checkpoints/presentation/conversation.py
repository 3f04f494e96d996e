"""A state's message lists as a conversation (templates/checkpoints/_conversation.html): who said
what, the tools the model called with their arguments, and what each tool returned.

It reads the shapes the agent frameworks store, as plain JSON:

- OpenAI chat messages and most hand-written agents: `{"role", "content", "tool_calls",
  "tool_call_id", "name"}` (the demo agents, LangGraph states of plain dicts);
- the OpenAI Agents SDK's session items (`{"items": [...]}`): role messages with `input_text` /
  `output_text` parts, `function_call`, `function_call_output` and `reasoning` items;
- LangChain messages as JSON: `{"type": "human" | "ai" | "tool" | "system", "content",
  "tool_calls"}`, also wrapped as `{"type", "data": {...}}` (`messages_to_dict`);
- Pydantic AI's message history (`ModelMessagesTypeAdapter`): `{"kind": "request" | "response",
  "parts": [{"part_kind": ...}]}`;
- LangChain message objects in a LangGraph state, which its saver stores as msgpack envelopes
  (`{"__lg_typed__": [...]}`), read by `msgpack_view` into the fields above;
- Google ADK contents (`{"role": "user" | "model", "parts": [{"text"}, {"function_call"},
  {"function_response"}]}`), such as the event each ADK checkpoint holds.

Nothing here is marked safe: every text goes to the template as a string, escaped there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from checkpoints.presentation.diffview import pretty
from checkpoints.presentation.msgpack_view import unwrap

# A list is a conversation when it has at least this many items and at least half read as messages.
MIN_MESSAGES = 1
# Conversations looked for this deep in the state (LangGraph keeps them under /channel_values).
SEARCH_DEPTH = 3
# At most this many conversations on a page, and the newest this many messages of each.
MAX_CONVERSATIONS = 3
MAX_MESSAGES = 200
# Characters of one text, tool arguments or tool result shown; the JSON tree has them in full.
TEXT_CHARS = 20_000
# Characters of a role or name shown where it labels a message.
NAME_CHARS = 80
ROLES = {
    "user": "user", "human": "user", "humanmessage": "user", "humanmessagechunk": "user",
    "assistant": "assistant", "ai": "assistant", "aimessage": "assistant", "aimessagechunk": "assistant",
    "model": "assistant",
    "system": "system", "developer": "system", "systemmessage": "system",
    "tool": "tool", "function": "tool", "toolmessage": "tool", "functionmessage": "tool",
}  # fmt: skip
WHO = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool", "other": "Other"}
_ITEM_TYPES = {"message", "function_call", "function_call_output", "reasoning"}


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: str
    id: str = ""


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    id: str = ""
    error: bool = False


@dataclass
class Turn:
    """One message: its role (user, assistant, system, tool or other) and what it holds."""

    role: str
    who: str
    texts: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # reasoning, thinking: shown folded

    @property
    def empty(self) -> bool:
        return not (self.texts or self.tool_calls or self.tool_results or self.notes)


@dataclass(frozen=True)
class Conversation:
    path: str  # JSON pointer of the list in the state
    turns: list[Turn]
    total: int  # messages in the list (`turns` holds the newest MAX_MESSAGES)

    @property
    def hidden(self) -> int:
        return self.total - len(self.turns)


def conversations(state: Any) -> list[Conversation]:
    """The message lists in `state`, as conversations, in the order they appear (at most MAX_CONVERSATIONS)."""
    found: list[Conversation] = []
    for path, value in _candidates(state, "", 0):
        if isinstance(value, dict):
            turn = _turn(value)
            if turn is not None and not turn.empty:
                found.append(Conversation(path=path, turns=[turn], total=1))
        else:
            turns = [turn for item in value[-MAX_MESSAGES:] if (turn := _turn(item)) is not None]
            found.append(Conversation(path=path, turns=_named_results(turns), total=len(value)))
        if len(found) == MAX_CONVERSATIONS:
            break
    return found


def _named_results(turns: list[Turn]) -> list[Turn]:
    """Tool results that carry only the call's id (OpenAI's shapes) named after the call."""
    names = {call.id: call.name for turn in turns for call in turn.tool_calls if call.id and call.name}
    for turn in turns:
        turn.tool_results = [
            replace(result, name=names.get(result.id, "")) if not result.name and result.id else result
            for result in turn.tool_results
        ]
    return turns


def _candidates(value: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    if isinstance(value, list):
        if _is_conversation(value):
            yield path, value
        return
    if not isinstance(value, dict) or depth > SEARCH_DEPTH:
        return
    if depth > 0 and _is_content(value):  # a single ADK content, as in an ADK checkpoint's event
        yield path, value
        return
    for key, child in value.items():
        yield from _candidates(child, f"{path}/{_escape(str(key))}", depth + 1)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _is_conversation(items: list[Any]) -> bool:
    if len(items) < MIN_MESSAGES:
        return False
    # Decided by the newest messages (what is shown); the others need not be looked at.
    sample = items[-50:]
    readable = sum(1 for item in sample if _looks_like_message(item))
    return readable > 0 and readable * 2 >= len(sample)


def _looks_like_message(item: Any) -> bool:
    item = unwrap(item)
    if not isinstance(item, dict):
        return False
    role = item.get("role")
    if isinstance(role, str) and (role.lower() in ROLES) and ("content" in item or "parts" in item
                                                               or "tool_calls" in item):  # fmt: skip
        return True
    kind = item.get("type")
    if isinstance(kind, str) and kind in _ITEM_TYPES:
        return True
    if isinstance(kind, str) and kind.lower() in ROLES and ("content" in item or "data" in item):
        return True
    return item.get("kind") in ("request", "response") and isinstance(item.get("parts"), list)


def _is_content(value: dict[str, Any]) -> bool:
    return isinstance(value.get("role"), str) and isinstance(value.get("parts"), list) and "kind" not in value


def _turn(item: Any) -> Turn | None:
    item = unwrap(item)
    if not isinstance(item, dict):
        return Turn(role="other", who=WHO["other"], texts=[_cut(_text_of(item))])
    if item.get("kind") in ("request", "response") and isinstance(item.get("parts"), list):
        return _pydantic_ai(item)
    kind = item.get("type")
    if kind == "function_call":
        call = ToolCall(name=_str(item.get("name")), args=_args(item.get("arguments")), id=_str(item.get("call_id")))
        return Turn(role="assistant", who=WHO["assistant"], tool_calls=[call])
    if kind == "function_call_output":
        output = ToolResult(name="", content=_cut(_text_of(item.get("output"))), id=_str(item.get("call_id")))
        return Turn(role="tool", who=WHO["tool"], tool_results=[output])
    if kind == "reasoning":
        summary = item.get("summary") or item.get("content") or []
        return Turn(role="assistant", who=WHO["assistant"], notes=[_cut(_text_of(summary))] if summary else [])
    if isinstance(item.get("data"), dict) and isinstance(kind, str):  # LangChain's messages_to_dict
        return _chat({**item["data"], "type": kind})
    return _chat(item)


def _chat(item: dict[str, Any]) -> Turn:
    """OpenAI chat, LangChain and ADK messages, and the Agents SDK's role messages."""
    raw_role = item.get("role") if isinstance(item.get("role"), str) else item.get("type")
    role = ROLES.get(str(raw_role).lower(), "other")
    who = WHO[role] if role != "other" else (_str(raw_role)[:NAME_CHARS] or WHO["other"])
    if item.get("name") and role in ("user", "assistant"):
        who = f"{who} · {_str(item['name'])[:NAME_CHARS]}"
    turn = Turn(role=role, who=who)
    if role == "tool":
        turn.tool_results.append(ToolResult(
            name=_str(item.get("name")), content=_cut(_text_of(item.get("content"))),
            id=_str(item.get("tool_call_id")), error=item.get("status") == "error",
        ))  # fmt: skip
    else:
        _add_content(turn, item.get("content"))
    for part in _list(item.get("parts")):
        _add_adk_part(turn, part)
    for call in _list(item.get("tool_calls")):
        if isinstance(call, dict):
            function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
            turn.tool_calls.append(ToolCall(
                name=_str(function.get("name")), args=_args(function.get("arguments", function.get("args"))),
                id=_str(call.get("id")),
            ))  # fmt: skip
    return turn


def _add_content(turn: Turn, content: Any) -> None:
    if content is None or content == "":
        return
    if isinstance(content, str):
        turn.texts.append(_cut(content))
        return
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                turn.texts.append(_cut(part))
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                turn.texts.append(_cut(part["text"]))
            elif isinstance(part, dict) and part.get("type") in ("refusal",) and isinstance(part.get("refusal"), str):
                turn.notes.append(_cut(f"Refused: {part['refusal']}"))
            else:
                turn.notes.append(_cut(_text_of(part)))
        return
    turn.texts.append(_cut(_text_of(content)))


def _add_adk_part(turn: Turn, part: Any) -> None:
    if not isinstance(part, dict):
        return
    if isinstance(part.get("text"), str):
        (turn.notes if part.get("thought") else turn.texts).append(_cut(part["text"]))
    call = part.get("function_call") or part.get("functionCall")
    if isinstance(call, dict):
        turn.tool_calls.append(
            ToolCall(name=_str(call.get("name")), args=_args(call.get("args")), id=_str(call.get("id")))
        )
    response = part.get("function_response") or part.get("functionResponse")
    if isinstance(response, dict):
        turn.tool_results.append(ToolResult(name=_str(response.get("name")), id=_str(response.get("id")),
                                            content=_cut(_text_of(response.get("response")))))  # fmt: skip


def _pydantic_ai(message: dict[str, Any]) -> Turn:
    """A Pydantic AI request (system and user prompts, tool returns) or response (text, tool calls)."""
    parts = [part for part in message["parts"] if isinstance(part, dict)]
    kinds = {part.get("part_kind") for part in parts}
    if message["kind"] == "response":
        turn = Turn(role="assistant", who=WHO["assistant"])
    elif kinds and kinds <= {"tool-return", "retry-prompt"}:
        turn = Turn(role="tool", who=WHO["tool"])
    elif kinds == {"system-prompt"}:
        turn = Turn(role="system", who=WHO["system"])
    else:
        turn = Turn(role="user", who=WHO["user"])
    if isinstance(message.get("instructions"), str) and message["instructions"]:
        turn.notes.append(_cut(f"Instructions: {message['instructions']}"))
    for part in parts:
        kind, content = part.get("part_kind"), part.get("content")
        if kind == "tool-call":
            turn.tool_calls.append(ToolCall(name=_str(part.get("tool_name")), args=_args(part.get("args")),
                                            id=_str(part.get("tool_call_id"))))  # fmt: skip
        elif kind in ("tool-return", "retry-prompt") and (part.get("tool_name") or kind == "tool-return"):
            turn.tool_results.append(
                ToolResult(name=_str(part.get("tool_name")), content=_cut(_text_of(content)),
                           id=_str(part.get("tool_call_id")), error=kind == "retry-prompt")
            )  # fmt: skip
        elif kind == "system-prompt" and turn.role != "system":
            turn.notes.append(_cut(f"System: {_text_of(content)}"))
        elif kind == "thinking":
            turn.notes.append(_cut(_text_of(content)))
        else:
            _add_content(turn, content)
    return turn


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    """A name or an id: a string as it is, anything else as short JSON."""
    if isinstance(value, str):
        return value[:TEXT_CHARS]
    return "" if value is None else pretty(value, limit=NAME_CHARS).text


def _args(value: Any) -> str:
    """Tool arguments, pretty: a JSON string (as OpenAI sends them) is parsed first."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return _cut(value)
    if value is None:
        return ""
    return _text_of(value)


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, dict) and isinstance(part.get("text"), str) for part in value):
        return "\n".join(part["text"] for part in value)
    shown = pretty(value, limit=TEXT_CHARS)  # encodes no more than is shown
    return shown.text + (" …" if shown.truncated else "")


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + f"… ({len(text) - TEXT_CHARS:,} more characters)"
