# eaglepipe: prompt sets -> target responses -> exact token ids -> hidden states -> EAGLE-3 drafter.
# Read top-down, this file is the pipeline; each stage's rule lives in rules/, its logic in eaglepipe/.

configfile: "config.yaml"


include: "rules/common.smk"


rule all:
    input:
        expand("results/{ds}/hidden.done", ds=DATASETS),
        "results/drafter/config.json",
        "results/drafter/model.safetensors",
        "results/drafter/eval.json",
    default_target: True


include: "rules/target.smk"  # the target model's local files (built only for the embedded default)
include: "rules/prompts.smk"  # 0. resources/prompts/{ds}.jsonl from each set's source
include: "rules/generate.smk"  # 1. results/providers.json, results/{ds}/responses.jsonl (paid)
include: "rules/tokens.smk"  # 2. results/{ds}/tokens.safetensors + tokens.json
include: "rules/hidden.smk"  # 3. results/{ds}/hidden.done + shards (GPU)
include: "rules/drafter.smk"  # 4-5. results/drafter/{config.json, model.safetensors, eval.json}
