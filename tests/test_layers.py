"""The package's import graph runs one way: a module imports only from its own package or a lower layer, so
there is no circle between packages. `python tests/test_layers.py` prints the graph between packages."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "eaglepipe"
# Lowest first: the base of every stage's errors with the records every layer holds (a chat's turns, tools and
# calls; the config's shape), the chat API's wire payloads (built by the emulator, read by the client) and the
# results layout, the ground floor, the target's facts, the prompts and the response record (written by
# generation and the answer sources, read by the token stage below them), then the stages in pipeline order
# (the emulator is generation's stand-in API; answers from elsewhere reuse generation's readers), then what
# looks over the whole run.
LAYERS = [
    ["eaglepipe.errors", "eaglepipe.messages", "eaglepipe.config_types"],
    ["eaglepipe.chat_api", "eaglepipe.layout"],  # the layout sits below the config, which reads paths back
    ["eaglepipe", "eaglepipe.io", "eaglepipe.progress", "eaglepipe.config", "eaglepipe.processes"],
    ["eaglepipe.envs"],
    ["eaglepipe.target", "eaglepipe.prompts", "eaglepipe.responses"],
    ["eaglepipe.tokens"],
    ["eaglepipe.emulator"],
    ["eaglepipe.openrouter"],
    ["eaglepipe.answers"],
    ["eaglepipe.hidden"],
    ["eaglepipe.drafter"],
    ["eaglepipe.plan", "eaglepipe.figures"],
    ["eaglepipe.jobs"],
]
LAYER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """The package a module belongs to (`eaglepipe.tokens.rebuild` -> `eaglepipe.tokens`)."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every eaglepipe import, lazy ones inside functions included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
    return [(line, module) for line, module in found if module.split(".")[0] == "eaglepipe"]


def package_edges() -> dict[str, dict[str, list[str]]]:
    """{importing package: {imported package: ["file:line", ...]}}."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        for line, module in imports(path):
            target = unit_of(module)
            if target != source:
                edges[source][target].append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def test_every_package_has_a_layer():
    units = {unit_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert sorted(units - set(LAYER)) == []


def test_imports_only_go_down_the_layers():
    upward = [
        f"{where}: {source} imports {target}"
        for source, targets in package_edges().items()
        for target, places in targets.items()
        if LAYER[target] >= LAYER[source]
        for where in places
    ]
    assert upward == []


def main() -> None:
    for source, targets in sorted(package_edges().items(), key=lambda item: (LAYER[item[0]], item[0])):
        listed = ", ".join(f"{target} ({len(places)})" for target, places in sorted(targets.items()))
        print(f"[{LAYER[source]}] {source} -> {listed}")


if __name__ == "__main__":
    sys.exit(main())
