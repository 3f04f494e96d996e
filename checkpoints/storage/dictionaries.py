"""Built-in zstd dictionaries: the words a stored delta repeats on every row, so a small frame
does not spell them out each time (checkpoints/storage/codec.py frames with them).

A dictionary is "raw content": zstd starts every frame as if these bytes had just been written,
so a delta can refer back to them. Each holds the canonical JSON (sorted keys, no spaces) of RFC
6902 operations and of the message and event shapes of the frameworks Quicksave integrates: the
OpenAI Agents SDK's items, LangChain/LangGraph messages, Google ADK events and Pydantic AI's
messages, with their values left empty (no prose: what a value says is the agent's own). The
most repeated words come last, where zstd's nearest offsets are cheapest.

A frame names its dictionary by number, so a dictionary never changes once released: a better one
is a new number, and frames written with the old one keep opening.
"""

from __future__ import annotations

import zstandard

_PYDANTIC_AI = (
    b'{"instructions":null,"kind":"request","parts":[{"content":"","part_kind":"user-prompt","timestamp":"'
    b'{"content":"","part_kind":"system-prompt","timestamp":"'
    b'{"content":"","part_kind":"tool-return","timestamp":"","tool_call_id":"","tool_name":""}'
    b'{"args":{},"id":null,"part_kind":"tool-call","tool_call_id":"","tool_name":""}'
    b'{"finish_reason":"stop","kind":"response","model_name":"","parts":[{"content":"","id":null,"part_kind":"text"}],'
    b'"provider_name":"","timestamp":"","usage":{"details":{},"input_tokens":0,"output_tokens":0}}'
)
_ADK = (
    b'{"function_response":{"id":"","name":"","response":{"result":""}}}'
    b'{"function_call":{"args":{},"id":"adk-","name":""}}'
    b'{"actions":{"artifact_delta":{},"requested_auth_configs":{},"requested_tool_confirmations":{},"state_delta":{}},'
    b'"author":"","content":{"parts":[{"text":""}],"role":"model"},"id":"","invocation_id":"e-","timestamp":'
)
_LANGCHAIN = (
    b'{"args":{},"id":"call_","name":"","type":"tool_call"}'
    b'{"content":"","id":"","name":"","status":"success","tool_call_id":"call_","type":"tool"}'
    b'{"additional_kwargs":{},"content":"","id":"run-","name":null,"response_metadata":{},"tool_calls":[],'
    b'"type":"ai","usage_metadata":null}'
    b'{"additional_kwargs":{},"content":"","id":"","name":null,"response_metadata":{},"type":"human"}'
)
_OPENAI_AGENTS = (
    b'{"id":"rs_","summary":[],"type":"reasoning"}'
    b'{"arguments":"{}","call_id":"call_","id":"fc_","name":"","status":"completed","type":"function_call"}'
    b'{"call_id":"call_","output":"","type":"function_call_output"}'
    b'{"content":"","role":"system"}'
    b'{"content":[{"annotations":[],"logprobs":[],"text":"","type":"output_text"}],"id":"msg_","role":"assistant",'
    b'"status":"completed","type":"message"}'
    b'{"content":"","role":"user"}'
)
_JSON_PATCH = (
    b'[{"op":"remove","path":"/'
    b'[{"op":"replace","path":"/'
    b'[{"op":"add","path":"/messages/-","value":'
    b'[{"op":"add","path":"/items/-","value":'
)

# Frame number -> dictionary content. Never edit a released entry (see the module's docstring).
DICTIONARIES: dict[int, bytes] = {1: _PYDANTIC_AI + _ADK + _LANGCHAIN + _OPENAI_AGENTS + _JSON_PATCH}
# The dictionary new frames use.
CURRENT = 1


def dictionary(number: int) -> zstandard.ZstdCompressionDict:
    """The dictionary a frame names (KeyError for a number this version does not know): a new
    object each call, for one compressor or decompressor (which codec keeps in pools), so no two
    threads share one."""
    return zstandard.ZstdCompressionDict(DICTIONARIES[number], dict_type=zstandard.DICT_TYPE_RAWCONTENT)
