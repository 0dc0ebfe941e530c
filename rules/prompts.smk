# 0. Prompt sets: validated, deduplicated, ids assigned, in the seeded order that budgets cut in.


rule prompts:
    input:
        source=source_inputs,
    output:
        prompts=LAYOUT.prompt_set(),
    params:
        source=lambda wildcards: config["sources"][wildcards.ds],
        seed=config["prompts"]["seed"],
        strip_trailing_assistant=config["prompts"]["strip_trailing_assistant"],
    log:
        LAYOUT.log("prompts/{ds}.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/prompts.py"
