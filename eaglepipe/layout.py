"""Where a run's files live: the one owner of every results path.

The rules (`rules/common.smk`), the spend plan, the generation stage and the tests build paths through
`RunLayout`, so renaming a file here moves every reader and writer with it. A set name may be a Snakemake
wildcard (`"{ds}"`); the paths are then patterns the rules fill. Torch-free: the Snakefile imports it at
parse time. `RunLayout.classify` reads a path back through the same members, so no other code takes a path
apart by its folder or file names.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path

WILDCARD = "{ds}"
# What a member is called with to find where its argument lands in the path it builds.
_SLOT = "\0"


@dataclass(frozen=True)
class RunPath:
    """What a path under a run's roots is. `kind` names the `RunLayout` member that builds it ("results" or
    "prompts" for a path under a root that no member names); `ds` is the set of a set's file; `below` holds
    the parts under the member's path for a path inside one of its folders (a shard in `shards`)."""

    kind: str
    ds: str | None = None
    below: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunLayout:
    """One configuration's roots (`paths.results`, `paths.prompts`) and every file the run keeps there."""

    results: Path
    prompts: Path

    @classmethod
    def from_paths(cls, results: str | Path, prompts: str | Path) -> RunLayout:
        return cls(Path(results), Path(prompts))

    def classify(self, path: str | Path) -> RunPath | None:
        """The member that builds `path`, or the deepest whose folder holds it; None outside both roots.
        The prompts root is read first: it may lie inside the results root (results/demo/prompts)."""
        parts = _parts(path)
        for kind, root in (("prompts", _parts(self.prompts)), ("results", _parts(self.results))):
            if parts[: len(root)] == root:
                return self._classify_under(kind, root, parts)
        return None

    def _classify_under(self, root_kind: str, root: tuple[str, ...], parts: tuple[str, ...]) -> RunPath:
        """The deepest member under `root` that matches `parts` (the first on a tie), else the root."""
        patterns = [pattern for pattern in self._patterns() if pattern.parts[: len(root)] == root]
        run_wide = _run_wide_folders(patterns, root) if root_kind == "results" else frozenset()
        found, depth = RunPath(root_kind, below=parts[len(root) :]), len(root)
        for pattern in patterns:
            match = pattern.match(parts) if len(pattern.parts) > depth else None
            if match is None:
                continue
            value, below = match
            if pattern.holds_set and pattern.slot == len(root) and value in run_wide:
                continue  # no set takes a run-wide folder's name (the config schema refuses them)
            found = RunPath(pattern.kind, value if pattern.holds_set else None, below)
            depth = len(pattern.parts)
        return found

    def _patterns(self) -> list[_Pattern]:
        """Every member's path, its argument left as a slot: built on each call, so a member changed at run
        time (a test renaming a file) is read back as it now builds."""
        patterns = []
        for name, argument in BUILDERS.items():
            member = getattr(self, name) if argument is None else getattr(self, name)(_SLOT)
            parts = _parts(member)
            slot = next((i for i, part in enumerate(parts) if _SLOT in part), None)
            patterns.append(_Pattern(name, parts, slot, argument == "ds"))
        return patterns

    # Run-wide files.
    @property
    def providers(self) -> Path:
        return self.results / "providers.json"

    @property
    def generation_settings(self) -> Path:
        """The operational generation settings, an ancient input of every generate job."""
        return self.results / "generation_settings.json"

    @property
    def ledger(self) -> Path:
        """The directory of the run's spending ledger, shared by every generation job."""
        return self.results / ".ledger"

    @property
    def engine_ledger(self) -> Path:
        """The ledger of the sets the team's own engine answers: its own, so they split the engine's
        concurrency among themselves and take nothing from bought sets' share (and book no dollars)."""
        return self.results / ".engine-ledger"

    @property
    def drafter(self) -> Path:
        """The exported drafter's directory (`config.json` + `model.safetensors`, as engines load it)."""
        return self.results / "drafter"

    @property
    def drafter_config(self) -> Path:
        return self.drafter / "config.json"

    @property
    def drafter_weights(self) -> Path:
        return self.drafter / "model.safetensors"

    @property
    def drafter_serving(self) -> Path:
        return self.drafter / "README.md"

    @property
    def drafter_target(self) -> Path:
        return self.drafter / "target.json"

    @property
    def train_report(self) -> Path:
        return self.drafter / "train.json"

    @property
    def evaluation(self) -> Path:
        return self.drafter / "eval.json"

    @property
    def snapshots(self) -> Path:
        return self.drafter / "snapshots"

    @property
    def curve(self) -> Path:
        return self.drafter / "curve.json"

    @property
    def speculators(self) -> Path:
        return self.drafter / "speculators"

    @property
    def speculators_config(self) -> Path:
        return self.speculators / "config.json"

    @property
    def speculators_weights(self) -> Path:
        return self.speculators / "model.safetensors"

    @property
    def speculators_target(self) -> Path:
        return self.speculators / "target.json"

    @property
    def drafter_checkpoints(self) -> Path:
        """A killed training resumes from here; undeclared, like the shards."""
        return self.results / ".checkpoints" / "drafter"

    def figure(self, stem: str) -> Path:
        return self.results / "figures" / f"{stem}.png"

    @property
    def run_summary(self) -> Path:
        return self.results / "figures" / "run_summary.txt"

    @property
    def run_summary_page(self) -> Path:
        """The end-of-run table as a web page: the report shows an .html result in place, a .txt only as a
        download."""
        return self.results / "figures" / "run_summary.html"

    @property
    def report(self) -> Path:
        return self.results / "report.html"

    def log(self, name: str) -> Path:
        return self.results / "logs" / name

    # Per set.
    def prompt_set(self, ds: str = WILDCARD) -> Path:
        return self.prompts / f"{ds}.jsonl"

    def set_dir(self, ds: str = WILDCARD) -> Path:
        return self.results / ds

    def responses(self, ds: str = WILDCARD) -> Path:
        return self.set_dir(ds) / "responses.jsonl"

    def responses_summary(self, ds: str = WILDCARD) -> Path:
        return self.set_dir(ds) / "responses.summary.json"

    def journal(self, ds: str = WILDCARD) -> Path:
        """Answers bought but not yet in responses.jsonl: what a resumed generation never buys again."""
        return self.set_dir(ds) / ".journal"

    def tokens(self, ds: str = WILDCARD) -> Path:
        return self.set_dir(ds) / "tokens.safetensors"

    def token_stats(self, ds: str = WILDCARD) -> Path:
        return self.set_dir(ds) / "tokens.json"

    def hidden_done(self, ds: str = WILDCARD) -> Path:
        return self.set_dir(ds) / "hidden.done"

    def shards(self, ds: str = WILDCARD) -> Path:
        return self.set_dir(ds) / "hidden"


def _builders() -> dict[str, str | None]:
    """Every member that builds a path (annotated `-> Path`), with the name of its argument (None for a
    property): `classify` reads paths back through exactly these."""
    found = {}
    for name, member in vars(RunLayout).items():
        function = member.fget if isinstance(member, property) else member
        if name.startswith("_") or not inspect.isfunction(function):
            continue
        if function.__annotations__.get("return") == "Path":
            arguments = list(inspect.signature(function).parameters)[1:]  # after self
            found[name] = arguments[0] if arguments else None
    return found


BUILDERS = _builders()


@dataclass(frozen=True)
class _Pattern:
    """A member's path with its argument (if any) at part `slot`; `holds_set` when that argument is a set."""

    kind: str
    parts: tuple[str, ...]
    slot: int | None
    holds_set: bool

    def match(self, parts: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]] | None:
        """(the argument's value, the parts below this path) when this path is `parts` or a folder above
        them. A log's or a figure's name may hold folders (logs/generate/B1.log): its slot, last, takes
        every part left; a set's name is one part."""
        if len(parts) < len(self.parts):
            return None
        for i, (want, part) in enumerate(zip(self.parts, parts, strict=False)):
            if i != self.slot and want != part:
                return None
        if self.slot is None:
            return None, parts[len(self.parts) :]
        takes_the_rest = self.slot == len(self.parts) - 1 and not self.holds_set
        text = "/".join(parts[self.slot :]) if takes_the_rest else parts[self.slot]
        before, after = self.parts[self.slot].split(_SLOT)
        if not (text.startswith(before) and text.endswith(after) and len(text) >= len(before) + len(after)):
            return None
        value = text[len(before) : len(text) - len(after)]
        return value, () if takes_the_rest else parts[len(self.parts) :]


def _run_wide_folders(patterns: list[_Pattern], root: tuple[str, ...]) -> frozenset[str]:
    """The results root's children that run-wide members use (drafter, logs, .ledger, report.html), given
    the members under that root."""
    return frozenset(pattern.parts[len(root)] for pattern in patterns if not pattern.holds_set)


def _parts(path: str | Path) -> tuple[str, ...]:
    return Path(os.path.normpath(path)).parts
