"""Does keeping the answers that differ from their bill only in their split help the drafter? The demo's
chain (SmolLM2 through the emulator, text only as vLLM returns it) at the real run's sampling (temperature
1.0, top_p 0.95, seeded) with answers long enough for splits to matter, run once to its evaluation with
`tokens.on_segmentation: keep` (the default) and again on the same bought answers with `drop` (what the
token stage did before: every count miss dropped). Prints, for each, the output tokens trained on and the
drafter's acceptance length on the same held-out prompts.

    .venv/bin/python bench/segmentation_training.py [--max-tokens 384] [--keep DIR]

Runs Snakemake on a scratch directory beside this checkout's resources; nothing under results/ is touched.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from eaglepipe.layout import RunLayout

REPO = Path(__file__).resolve().parent.parent
LAYOUT = RunLayout.from_paths("results/segmentation", "results/segmentation/prompts")  # in the work directory


def snakemake(workdir: Path, *extra: str) -> None:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        str(LAYOUT.evaluation),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(REPO / "config" / "local.yaml"),
        str(workdir / "bench.yaml"),
        "--cores",
        "2",
        "--resources",
        "api=2",
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])


def figures(workdir: Path, sets: list[str]) -> dict:
    yields = [json.loads((workdir / LAYOUT.token_stats(ds)).read_text())["yield"] for ds in sets]
    evaluation = json.loads((workdir / LAYOUT.evaluation).read_text())
    return {
        "bought": sum(y["bought_tokens"] for y in yields),
        "trained": sum(y["trained_tokens"] for y in yields),
        "segmentation_only": sum(y["trained_tokens_by_method"]["rebuilt_segmentation_only"] for y in yields),
        "acceptance": {name: m["acceptance_length"] for name, m in evaluation["methods"].items()},
        "held_out": evaluation.get("held_out_prompts"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--keep", type=Path, help="keep the scratch directory here")
    args = parser.parse_args()
    local = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    sets = local["datasets"]
    with tempfile.TemporaryDirectory(prefix="eaglepipe-segmentation-") as scratch:
        workdir = args.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        if not (workdir / "resources").exists():
            (workdir / "resources").symlink_to(REPO / "resources")
        overrides = {
            "paths": {"results": str(LAYOUT.results), "prompts": str(LAYOUT.prompts)},
            "generation": {"max_tokens": args.max_tokens},
        }
        (workdir / "bench.yaml").write_text(yaml.safe_dump(overrides))
        snakemake(workdir)
        kept = figures(workdir, sets)
        # Forced: the changed setting alone did not always replan the token stage here.
        snakemake(workdir, "--config", 'tokens={"on_segmentation": "drop"}', "--forcerun", "tokens")
        dropped = figures(workdir, sets)
    print(f"demo sets at temperature 1.0, max_tokens {args.max_tokens}; {kept['held_out']} held-out prompts")
    print(
        f"{'segmentation-only':18} {'tokens trained':>14} {'of bought':>9} "
        f"{'acceptance (trained drafter)':>29}"
    )
    for name, found in (("kept", kept), ("dropped", dropped)):
        share = f"{100 * found['trained'] / found['bought']:.1f}%"
        print(f"{name:18} {found['trained']:>14,} {share:>9} {found['acceptance'].get('eagle3'):>29}")
    print(
        f"prompt lookup {kept['acceptance'].get('prompt_lookup')}, untrained drafter "
        f"{kept['acceptance'].get('eagle3_untrained')}"
    )


if __name__ == "__main__":
    main()
