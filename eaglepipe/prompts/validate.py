"""Checking one prompt record, so that every later stage can trust the shape of a prompt set.

Normalization changes no meaning: text parts are joined into one string (chat templates take strings),
other keys and keys set to null are dropped, and (only when asked) trailing assistant turns are removed so
that the record ends where the target must answer. Earlier turns' reasoning (`reasoning`,
`reasoning_content`) is among the dropped keys on purpose: Kimi's template would render it inside the
current tool exchange, but whether a provider passes an assistant message's `reasoning` on to its template
is not documented, so the request and the token stage's rebuild both go without it and agree.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from eaglepipe.errors import EaglepipeError
from eaglepipe.messages import Message, Tool, ToolCall

ROLES = ("system", "user", "assistant", "tool")


class PromptError(EaglepipeError, ValueError):
    """A prompt source the user must fix; the message is one line naming where and what to do."""


class CheckedRecord(TypedDict):
    """A source's record once checked: a prompt record whose id may still be missing (then the content
    hash names it)."""

    id: NotRequired[str]
    messages: list[Message]
    tools: NotRequired[list[Tool]]


def _content(content: Any, *, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise PromptError(
            f"{where}: `content` must be a string or a list of text parts, not {type(content).__name__}"
        )
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise PromptError(
                f"{where} has a {kind!r} part; only text parts are supported: remove it or the prompt"
            )
        if not isinstance(part.get("text"), str):
            raise PromptError(f"{where} has a text part without a string `text`; fix or remove that part")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_calls(calls: Any, *, where: str) -> list[ToolCall]:
    if not isinstance(calls, list) or not all(
        isinstance(call, dict)
        and isinstance(call.get("function"), dict)
        and isinstance(call["function"].get("name"), str)
        for call in calls
    ):
        raise PromptError(
            f'{where}: `tool_calls` must be a list of {{"function": {{"name", "arguments"}}}} objects'
        )
    return calls


def _string(message: dict[str, Any], key: str, *, where: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise PromptError(f"{where}: `{key}` must be a string, not {type(value).__name__}")
    return value


def _message(message: Any, *, where: str) -> Message:
    if not isinstance(message, dict):
        raise PromptError(f'{where} is not an object; write it as {{"role": ..., "content": ...}}')
    role = message.get("role")
    if role not in ROLES:
        raise PromptError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    out: Message = {"role": role, "content": _content(message.get("content"), where=where)}
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant":
            raise PromptError(f"{where}: only assistant turns may have `tool_calls`, this one is {role!r}")
        out["tool_calls"] = _tool_calls(calls, where=where)
    if role == "tool":
        call_id, name = _string(message, "tool_call_id", where=where), _string(message, "name", where=where)
        if call_id is not None:
            out["tool_call_id"] = call_id
        if name is not None:
            out["name"] = name
    if out["content"] is None and "tool_calls" not in out:
        raise PromptError(
            f"{where}: `content` is missing or null; only an assistant turn with `tool_calls` may omit it"
        )
    return out


def validate_record(obj: Any, *, where: str, strip_trailing_assistant: bool) -> CheckedRecord:
    """The normalized `{"id"?, "messages", "tools"?}`; `where` ("path:line") starts every error message."""
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object with `messages`, not {type(obj).__name__}")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    normalized = [_message(message, where=f"{where}: message {n}") for n, message in enumerate(messages, 1)]
    if strip_trailing_assistant:
        while normalized and normalized[-1]["role"] == "assistant":
            normalized.pop()
        if not normalized:
            raise PromptError(f"{where}: only assistant turns; a prompt needs a user or tool turn to answer")
    last_role = normalized[-1]["role"]
    if last_role == "assistant":
        raise PromptError(
            f"{where}: ends on an assistant turn; end it on a user or tool turn, "
            "or set strip_trailing_assistant for this set"
        )
    if last_role == "system":
        raise PromptError(f"{where}: ends on a system turn; add the user turn the target should answer")

    given_id = obj.get("id")
    if given_id is not None:
        if not isinstance(given_id, str) or not given_id:
            raise PromptError(
                f"{where}: `id` must be a non-empty string; fix it or remove it to use the content hash"
            )
        record: CheckedRecord = {"id": given_id, "messages": normalized}
    else:
        record = {"messages": normalized}
    tools = obj.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise PromptError(f"{where}: `tools` must be a list of function declarations (objects)")
        record["tools"] = tools
    return record
