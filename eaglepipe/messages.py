"""The chat records every stage passes around (OpenAI's chat shape, docs/formats.md): a message, its tool
calls, a tool declaration. They sit on the ground floor because the prompts, the response record and the
target's chat formats (one layer, which may not import each other) all hold them.

Sources written by hand or by other tools may hold more keys, or keys of another type; the readers that
take them in (`prompts.validate`, the emulator's request check) are where that is checked."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class CallFunction(TypedDict):
    """The function a tool call names. `arguments` is the JSON text the model wrote; some sources hold
    the parsed object instead, which the chat formats render as the template's `tojson` would."""

    name: str
    arguments: Any


class ToolCall(TypedDict):
    """One call in an assistant turn (`tool_calls`)."""

    id: NotRequired[str]
    type: NotRequired[str]
    index: NotRequired[int]
    function: CallFunction


class ImageURL(TypedDict, total=False):
    url: str
    detail: str


class ContentPart(TypedDict, total=False):
    """One part of a content list; only text parts render (`prompts.validate` joins them)."""

    type: str
    text: str
    image_url: ImageURL


class Message(TypedDict):
    """One chat turn. `content` is None (or absent) only for an assistant turn that calls tools; a tool
    result names the call it answers (`tool_call_id`); earlier reasoning may ride along under either key."""

    role: str
    content: NotRequired[str | list[ContentPart] | None]
    name: NotRequired[str]
    reasoning: NotRequired[str | None]
    reasoning_content: NotRequired[str | None]
    tool_calls: NotRequired[list[ToolCall] | None]
    tool_call_id: NotRequired[str]


class FunctionDeclaration(TypedDict):
    """A declared function. `parameters` is the user's JSON schema: arbitrary JSON, left untyped."""

    name: str
    description: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]


class Tool(TypedDict):
    """One entry of a request's `tools`."""

    type: NotRequired[str]
    function: FunctionDeclaration
