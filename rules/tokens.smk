# 2. Token ids: the rendered prompt plus the completion, with a loss mask over the completion.


rule tokens:
    input:
        prompts=LAYOUT.prompt_set(),
        responses=LAYOUT.responses(),
        model=embedded_target(),
    output:
        tokens=LAYOUT.tokens(),
        stats=report(
            LAYOUT.token_stats(),
            caption="../report/tokens_json.rst",
            category=REPORT_CATEGORY["tokens"],
            labels={"set": "{ds}", "file": "tokens.json"},
        ),
    params:
        target=TARGET_DIR,
        settings=config["tokens"],
    log:
        LAYOUT.log("tokens/{ds}.log"),
    threads: CLUSTER["tokens"]["cpus"]
    resources:
        mem_mb=CLUSTER["tokens"]["mem_mb"],
        runtime=CLUSTER["tokens"]["runtime_min"],
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/tokens.py"
