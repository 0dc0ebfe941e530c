"""Kimi-K2.5's tool declarations: the text between `<|im_system|>tool_declare<|im_middle|>` and `<|im_end|>`.

The chat template renders key-sorted compact JSON; Moonshot's tokenizer code (and engines that call it to
fill the template's `tools_ts_str`) renders a TypeScript-style namespace instead. Which one a provider
used shows in the billed prompt tokens, so both are here. The TypeScript rendering follows the format of
Moonshot's `tool_declaration_ts.py` for plain JSON schemas (objects, arrays, enums, unions, anyOf,
descriptions, constraints, defaults); `$ref` schemas are refused.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from eaglepipe.messages import FunctionDeclaration, Tool
from eaglepipe.target.segments import RenderError

ToolFormat = Literal["json", "typescript"]
INDENT = "  "
# Constraints a field's comment lists, by its JSON-schema type.
CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("maxItems", "minItems"),
}
UNION_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
               "null": "null", "object": "{}", "array": "Array<any>"}


class ToolDeclarationError(RenderError):
    """A tool schema the chosen declaration format cannot render, in one line."""


def declare_tools(tools: list[Tool], tool_format: ToolFormat = "json") -> str:
    if tool_format == "json":
        return json.dumps(tools, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    if tool_format == "typescript":
        return tools_typescript(tools)
    raise ToolDeclarationError(f"tool format {tool_format!r} is unknown; use 'json' or 'typescript'")


def tools_typescript(tools: list[Tool]) -> str:
    """`# Tools` then a `functions` namespace with one `type name = (_: {...}) => any;` per function."""
    functions = [
        function_typescript(tool["function"])
        for tool in tools
        if tool.get("type") == "function" and tool.get("function")
    ]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


def function_typescript(function: FunctionDeclaration) -> str:
    parameters = function.get("parameters") or {}
    name = function.get("name", "function")
    signature = f"type {name} = (_: {object_typescript(parameters, '', name)}) => any;"
    description = comment_lines(function.get("description") or "", "")
    return "\n".join(part for part in (description, signature) if part)


def comment_lines(text: str, indent: str) -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def schema_comment(schema: Any, indent: str) -> str:
    """The `//` lines above a field: its description, then its type's constraints sorted by key."""
    if not isinstance(schema, dict):
        return ""
    lines = [comment_lines(schema["description"], indent)] if schema.get("description") else []
    kind = schema.get("type") if not ({"anyOf", "enum"} & schema.keys()) else None
    keys = CONSTRAINTS.get(kind, ()) if isinstance(kind, str) else ()
    constraints = sorted((key, schema[key]) for key in keys if key in schema)
    if constraints:
        lines.append(f"{indent}// " + ", ".join(f"{key}: {value}" for key, value in constraints))
    return "".join(line + "\n" for line in lines)


def field_typescript(name: str, schema: Any, optional: bool, indent: str, where: str) -> str:
    comment = schema_comment(schema, indent)
    default = schema.get("default") if isinstance(schema, dict) else None
    if default is not None:
        numeric = isinstance(default, (int, float, bool))
        shown = repr(default) if numeric else json.dumps(default, ensure_ascii=False)
        comment += f"{indent}// Default: {shown}\n"
    return f"{comment}{indent}{name}{'?' if optional else ''}: {type_typescript(schema, indent, where)}"


def object_typescript(schema: dict[str, Any], indent: str, where: str) -> str:
    """Required fields first, each group sorted by name; `additionalProperties` as an index signature."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    order = sorted(properties, key=lambda name: (name not in required, name))
    fields = [
        field_typescript(name, properties[name], name not in required, indent + INDENT, f"{where}.{name}")
        for name in order
    ]
    extra = schema.get("additionalProperties")
    if extra is not None:
        if isinstance(extra, bool):
            shown = "any" if extra else "never"
        else:
            shown = type_typescript(extra, indent + INDENT, where)
        fields.append(f"{indent}{INDENT}[k: string]: {shown}")
    if not fields:
        return "{}"
    return "{\n" + ",\n".join(fields) + f"\n{indent}}}"


def type_typescript(schema: Any, indent: str, where: str) -> str:
    if isinstance(schema, bool):
        return "any" if schema else "null"
    if not isinstance(schema, dict) or "$ref" in schema:
        raise ToolDeclarationError(
            f"tool schema {where}: {json.dumps(schema)[:80]} cannot be rendered as TypeScript here "
            "($ref and non-object schemas); declare tools as json"
        )
    if "anyOf" in schema:
        return " | ".join(type_typescript(option, indent, where) for option in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(f'"{value}"' if isinstance(value, str) else str(value) for value in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        unknown = [k for k in kind if k not in UNION_NAMES]
        if unknown:
            raise ToolDeclarationError(f"tool schema {where}: type {unknown[0]!r} is unknown; fix the schema")
        return " | ".join(UNION_NAMES[k] for k in kind)
    if kind == "object":
        return object_typescript(schema, indent, where)
    if kind == "array":
        return array_typescript(schema, indent, where)
    if not schema:
        return "any"
    if kind is None:
        raise ToolDeclarationError(f"tool schema {where} has no type, anyOf or enum; fix the schema")
    return "number" if kind == "integer" else str(kind)


def array_typescript(schema: dict[str, Any], indent: str, where: str) -> str:
    item = schema.get("items") or {"type": "any"}
    comment = schema_comment(item, indent + INDENT)
    if not comment:
        return f"Array<{type_typescript(item, indent, where)}>"
    inner = type_typescript(item, indent + INDENT, where)
    return f"Array<\n{comment}{indent}{INDENT}{inner}\n{indent}>"
