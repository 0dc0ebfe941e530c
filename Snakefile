# eaglepipe: prompt sets -> target responses -> exact token ids -> hidden states -> EAGLE-3 drafter.
# Read top-down, this file is the pipeline; each stage's rule lives in rules/, its logic in eaglepipe/.
# Paths below are relative to the configuration's results root (`paths.results`: results/ for the real
# run, results/demo/ for the embedded default); rules/common.smk builds them.

configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"


rule all:
    input:
        expand(LAYOUT.hidden_done(), ds=DATASETS),
        LAYOUT.drafter_config,
        LAYOUT.drafter_weights,
        LAYOUT.drafter_serving,
        LAYOUT.evaluation,
        [LAYOUT.figure(stem) for stem in FIGURES],
        # The drafter in speculators' format too, when asked (drafter.export_speculators).
        [LAYOUT.speculators_config] if config["drafter"]["export_speculators"] else [],
        # The learning curve, when training keeps drafters along the way (drafter.curve_points).
        [LAYOUT.curve] if config["drafter"]["curve_points"] else [],
    default_target: True


include: "rules/target.smk"  # the target model's local files (built only for the embedded default)
include: "rules/prompts.smk"  # 0. {paths.prompts}/{ds}.jsonl from each set's source
include: "rules/generate.smk"  # 1. providers.json, {ds}/responses.jsonl (paid)
include: "rules/tokens.smk"  # 2. {ds}/tokens.safetensors + tokens.json
include: "rules/hidden.smk"  # 3. {ds}/hidden.done + shards (GPU)
include: "rules/drafter.smk"  # 4-5. drafter/{config.json, model.safetensors, eval.json, curve.json}
include: "rules/figures.smk"  # 6. figures/*.png for the report; the end-of-run table
