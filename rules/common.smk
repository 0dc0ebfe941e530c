# Config validation and the helpers every rule uses. Nothing here touches the network or reads a key.

import re
import sys
from pathlib import Path

from eaglepipe.config import ConfigError, is_local_api, sets_answered_by, validate_config
from eaglepipe.config_types import Source
from eaglepipe.figures import FIGURES
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.dollars import dollar_budget_param
from eaglepipe.openrouter.fingerprint import config_fingerprint, engine_fingerprint
from eaglepipe.openrouter.settings import engine_request_params, operational_params, request_params
from eaglepipe.prompts import PromptError, check_edited_source, strip_setting
from eaglepipe.target.tiny import TEACHER_FILES, TINY_TARGETS

try:
    validate_config(config, Path(workflow.basedir) / "schemas" / "config.schema.yaml")
except ConfigError as error:
    sys.exit(f"eaglepipe: {error}")

DATASETS = config["datasets"]
LOCAL_API = is_local_api(config)
TARGET_DIR = config["target"]["path"]
# Every path of the run comes from the layout of the configuration's roots, so the embedded default
# (results/demo) and the real run (results) never plan, spend or satisfy each other's files. Members taking
# a set default to the `{ds}` wildcard; a param holding one is a str, which Snakemake fills.
LAYOUT = RunLayout.from_paths(config["paths"]["results"], config["paths"]["prompts"])
# What each cluster job asks its scheduler for; the rules show it in their `resources:`.
CLUSTER = config["cluster"]


def gpu_model(gpus):
    """The GPU type as a resource for a job that asks GPUs, when the config names one."""
    model = CLUSTER["gpu_model"]
    return {"gpu_model": model} if model and gpus else {}


# The report's categories: one per stage, numbered in pipeline order (a figure's stem starts with its stage).
REPORT_CATEGORY = {
    "run": "0. Run",
    "generation": "1. Generation",
    "tokens": "2. Token ids",
    "hidden": "3. Hidden states",
    "drafter": "4. Drafter",
}


def figure(stem):
    """A figure file marked for the report, with its caption report/{stem}.rst and its stage's category."""
    return report(
        LAYOUT.figure(stem),
        caption=f"../report/{stem}.rst",
        category=REPORT_CATEGORY[stem.split("_")[0]],
    )


def sets_pattern(sets):
    """A `ds` wildcard constraint matching exactly these sets (none: nothing)."""
    return "|".join(map(re.escape, sets)) if sets else "(?!)"


wildcard_constraints:
    ds=sets_pattern(DATASETS),


# Where each set's answers come from (`answers`): one generation rule per source, each constrained to its
# sets, so a set's rule and inputs show in its plan.
BOUGHT_SETS = sets_answered_by(config, Source.OPENROUTER, DATASETS)
ENGINE_SETS = sets_answered_by(config, Source.ENGINE, DATASETS)
IMPORTED_SETS = sets_answered_by(config, Source.IMPORT, DATASETS)


def imported_answers(wildcards):
    """The file an imported set's answers are read from (editing it reruns the set)."""
    return config["answers"]["sets"][wildcards.ds]["path"]


def engine_gpus():
    """GPUs an engine job asks for: those of the server it starts; none when one is already running."""
    return 0 if config["engine"]["base_url"] else config["engine"]["gpus"]


def embedded_target():
    """The target directory as an input only when a rule builds it; a real target is used in place."""
    return [TARGET_DIR] if config["target"]["embedded"] else []


def emulator_log(path):
    """The emulator's log beside the job's, where the job starts one (api.base_url: local)."""
    return {"emulator": path} if LOCAL_API else {}


def target_reference():
    """How a serving node finds the target (eaglepipe.drafter.export.TargetReference): by `target.name`;
    this node's path only as provenance; an embedded target was built here, so no hub has it."""
    return {
        "name": config["target"]["name"],
        "path": str(Path(TARGET_DIR).resolve()),
        "local_only": bool(config["target"]["embedded"]),
    }


def embedded_target_teacher():
    """The conversations a tiny embedded target is trained to answer (editing one rebuilds it)."""
    if config["target"]["embedded"] not in TINY_TARGETS:
        return []
    return [str(Path(workflow.basedir) / path) for path in TEACHER_FILES]


def source_inputs(wildcards):
    """A local JSONL source is a file input (editing it reruns its set); a dataset download is not.

    An edited source is read now, before any job runs: a broken one stops here with its line and the
    built set stays, so putting the same bytes back reruns nothing downstream."""
    source = config["sources"][wildcards.ds]
    if source["type"] != "jsonl":
        return []
    built = LAYOUT.prompt_set(wildcards.ds)
    source, strip = strip_setting(source, config["prompts"]["strip_trailing_assistant"])
    try:
        check_edited_source(source, built, seed=config["prompts"]["seed"], strip_trailing_assistant=strip)
    except PromptError as error:
        sys.exit(f"eaglepipe: {error} (nothing ran; {built} is kept)")
    return [source["path"]]


GENERATION_FINGERPRINT = config_fingerprint(config)
ENGINE_FINGERPRINT = engine_fingerprint(config)


def set_dollar_budget(wildcards):
    """The generate rule's `dollar_budget` param: the budget the set runs under, and reruns on."""
    reruns_for = {
        "fingerprint": GENERATION_FINGERPRINT,
        "output_token_budget": config["budget"]["output_tokens_per_dataset"],
    }
    ds = wildcards.ds
    return dollar_budget_param(config, BOUGHT_SETS, LAYOUT.responses_summary(ds), LAYOUT.responses(ds), reruns_for)


def generation_settings_input(wildcards):
    """The generate job's settings file, ancient; none for a set answered before that file existed (or
    brought in), so the set still counts as done: a missing input would rerun it, and so buy it again."""
    if LAYOUT.responses(wildcards.ds).is_file() and not LAYOUT.generation_settings.is_file():
        return []
    return ancient(LAYOUT.generation_settings)


# The spend plan, on stderr while parsing, so `snakemake -n` shows it and a real run shows it before it
# spends (parse time cannot tell the two apart). Jobs that Snakemake re-parses the workflow for
# (`--mode subprocess` / `remote`) skip it.
if workflow.is_main_process:
    from eaglepipe.config import target_outside_datasets
    from eaglepipe.plan import command_line_targets, dropped_profile_configfiles, print_spend_plan

    # A workflow profile's config files (the demo's config/local.yaml) are dropped by a --configfile on the
    # command line: refuse, in one line, rather than run the real run's config under the demo's profile.
    if "--configfile" in sys.argv and (problem := dropped_profile_configfiles(sys.argv)):
        sys.exit(f"eaglepipe: {problem}")

    # A target of a set that `datasets` lacks has no rule: one line naming the key instead of the plan and
    # Snakemake's "No rule to produce". The command line is parsed only when a word could be one.
    if any(target_outside_datasets(word, DATASETS, LAYOUT, []) for word in sys.argv[1:]):
        # Files given with --configfile override the Snakefile's own, which Snakemake lists after them.
        by_precedence = sorted(workflow.configfiles, key=lambda path: path in workflow.overwrite_configfiles)
        for target in command_line_targets(sys.argv):
            if problem := target_outside_datasets(target, DATASETS, LAYOUT, by_precedence):
                sys.exit(f"eaglepipe: {problem}")

    print_spend_plan(
        config,
        DATASETS,
        GENERATION_FINGERPRINT,
        argv=sys.argv,
        layout=LAYOUT,
    )


onstart:
    from eaglepipe.openrouter.errors import OpenRouterError
    from eaglepipe.openrouter.connection import check_key_for_pending_sets

    try:
        check_key_for_pending_sets(config, DATASETS, LAYOUT)
    except OpenRouterError as error:
        sys.exit(f"eaglepipe: {error}")
