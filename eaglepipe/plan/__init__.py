"""The spend plan: what the sets still to generate will cost and what their hidden states will take on disk.

Printed at parse time, so `snakemake -n` shows it and a real run shows the same plan before it spends.
`estimate` reads the files, `table` words the result; this module picks the sets a command targets.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

import yaml

from eaglepipe.config import sets_to_buy
from eaglepipe.config_types import Config
from eaglepipe.layout import RunLayout, RunPath
from eaglepipe.plan.estimate import spend_plan
from eaglepipe.plan.table import format_plan

DRY_RUN_FLAGS = re.compile(r"-[A-Za-z]*n[A-Za-z]*")


def sets_named_by(targets: Iterable[str], datasets: list[str], layout: RunLayout) -> list[str]:
    """The sets whose files the targets are (a prompt file buys nothing); every set when no target is
    given or one is not a single set's file (a rule name, the drafter), since those need every set."""
    targets = list(targets)
    if not targets:
        return list(datasets)
    named = set()
    for target in targets:
        found = _set_file(target, datasets, layout)
        if found is None:
            return list(datasets)
        if found.kind != "prompt_set":
            named.add(found.ds)
    return [ds for ds in datasets if ds in named]


# What a set's file (its RunLayout member) is the output of, furthest stage first: a command's goal is the
# furthest its targets name; any other file of a set's is the answers'.
GOALS = ((("hidden_done", "shards"), "hidden states"), (("tokens", "token_stats"), "token ids"))


def goal_of(targets: Iterable[str], datasets: list[str], layout: RunLayout) -> str:
    """What the command builds (SpendPlan.goal): a drafter unless every target is one set's file, else the
    furthest stage those files belong to."""
    files = [_set_file(target, datasets, layout) for target in targets]
    if not files or None in files:
        return "drafter"
    kinds = {found.kind for found in files if found is not None and not found.below}
    for members, goal in GOALS:
        if kinds.intersection(members):
            return goal
    return "answers"


def _set_file(path: str, datasets: list[str], layout: RunLayout) -> RunPath | None:
    """What `path` is when it lies in one of `datasets`' folders (not the folder itself) or is a built
    prompt set; None for anything else."""
    found = layout.classify(path)
    if found is None or found.ds is None:
        return None
    if found.kind == "prompt_set":
        return found
    in_a_set = found.ds in datasets and (found.kind != "set_dir" or found.below)
    return found if in_a_set else None


def command_line_targets(argv: list[str]) -> list[str]:
    """The targets of a `snakemake` command line, parsed by Snakemake's own parser (at parse time the
    workflow does not know them yet); none when this process was not started as `snakemake`. Building
    that parser costs most of a second, so callers first check that a word could be a target at all."""
    args = command_line_args(argv)
    return [] if args is None else list(args.targets or [])


def same_configuration(argv: list[str]) -> str | None:
    """The options of a `snakemake` command line that gave the run its configuration (its profiles, then
    its config files), as a hint repeats them; None when this process was not started as `snakemake`."""
    args = command_line_args(argv)
    if args is None:
        return None
    options = [f"{flag} {value}" for flag, value in (("--profile", args.profile),
                                                     ("--workflow-profile", args.workflow_profile)) if value]
    options += [f"--configfile {path}" for path in args.configfile or []]
    return "".join(f" {option}" for option in options)


def dropped_profile_configfiles(argv: list[str]) -> str | None:
    """Why a `--configfile` on the command line quietly replaced its workflow profile's own config files
    (Snakemake takes the command line's list instead of the profile's), or None. Without them the demo's
    profile would run the real run's config: OpenRouter, its budget, `results/`. Paths are compared by
    their trailing parts: the process may already be in the run's `--directory`."""
    args = command_line_args(argv)
    if args is None or not args.configfile or not args.workflow_profile:
        return None
    profile = Path(args.workflow_profile)
    try:
        settings = yaml.safe_load((profile / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    wanted = [Path(os.path.normpath(path)) for path in settings.get("configfile") or []]
    given = [Path(os.path.normpath(path)).parts for path in args.configfile]
    missing = [str(p) for p in wanted if not any(parts[-len(p.parts) :] == p.parts for parts in given)]
    if not missing:
        return None
    named = " ".join(str(path) for path in args.configfile)
    return (
        f"--configfile {named} replaced the config files of {profile} ({', '.join(missing)}), so this would "
        f"run the real run's config; give them first: --configfile {' '.join([*missing, named])}"
    )


def command_line_args(argv: list[str]) -> Any:
    """`argv` read by Snakemake's own argument parser, or None for a process not started as `snakemake`."""
    program = Path(argv[0]) if argv else Path()
    if "snakemake" not in (program.name, program.parent.name):
        return None
    from snakemake.cli import get_argument_parser

    args, _unknown = get_argument_parser().parse_known_args(argv[1:])
    return args


def print_spend_plan(
    config: Config,
    datasets: list[str],
    fingerprint: str,
    *,
    argv: list[str],
    layout: RunLayout,
    stream: TextIO = sys.stderr,
) -> None:
    """The parse-time hook: the plan for the sets the command line targets. Advisory, so a failure to
    plan is reported in one line and never stops the workflow."""
    try:
        could_narrow = any(_set_file(word, datasets, layout) is not None for word in argv[1:])
        targets = command_line_targets(argv) if could_narrow else []
        scope = sets_named_by(targets, datasets, layout)
        plan = spend_plan(config, scope, fingerprint, layout=layout, goal=goal_of(targets, datasets, layout))
        text = format_plan(plan)
        if problem := key_file_problem(config, layout):  # above the closing sentence, which stays last
            *body, closing = text.rsplit("\n", 1)
            text = "\n".join([*body, problem, closing])
    except Exception as error:  # whatever breaks an estimate must not block the run
        print(f"eaglepipe: no spend plan ({type(error).__name__}: {error})", file=stream)
        return
    if is_dry_run(argv):
        # Last, after Snakemake's job list, where a dry run's reader looks; a real run shows it before it
        # starts spending (parse time is before any job).
        atexit.register(lambda: print(text, file=stream, flush=True))
    else:
        print(text, file=stream)


def key_file_problem(config: Config, layout: RunLayout) -> str | None:
    """A real run would stop before buying when sets are still to buy and the key file is missing or empty:
    a dry run says so too. The file is looked at, never read (the plan reads no key)."""
    if not sets_to_buy(config, config["datasets"], layout):
        return None
    api = config["api"]
    named = api["key_file"] or os.environ.get(api["key_file_env"])
    if not named:
        return (
            f"warning: no API key file (api.key_file, or export {api['key_file_env']}=/path/to/keyfile): a "
            "real run stops there, before buying anything"
        )
    path = Path(named).expanduser()
    if not path.is_file() or path.stat().st_size == 0:
        state = "does not exist" if not path.exists() else "is empty"
        return f"warning: API key file {path} {state}: a real run stops there, before buying anything"
    return None


def is_dry_run(argv: list[str]) -> bool:
    """`-n` (alone or among short flags, `-np`), `--dry-run` or `--dryrun` on the command line."""
    return any(
        word in ("--dry-run", "--dryrun") or (DRY_RUN_FLAGS.fullmatch(word) is not None)
        for word in argv[1:]
    )
