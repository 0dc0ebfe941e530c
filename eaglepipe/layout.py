"""Where a run's files live: the one owner of every results path.

The rules (`rules/common.smk`), the spend plan, the generation stage and the tests build paths through
`RunLayout`, so renaming a file here moves every reader and writer with it. A set name may be a Snakemake
wildcard (`"{ds}"`); the paths are then patterns the rules fill. Torch-free: the Snakefile imports it at
parse time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WILDCARD = "{ds}"


@dataclass(frozen=True)
class RunLayout:
    """One configuration's roots (`paths.results`, `paths.prompts`) and every file the run keeps there."""

    results: Path
    prompts: Path

    @classmethod
    def from_paths(cls, results: str | Path, prompts: str | Path) -> RunLayout:
        return cls(Path(results), Path(prompts))

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
