# 4. Train the EAGLE-3 drafter on every set's shards except the held-out prompts, export it for SGLang/vLLM.
# 5. Evaluate it from the exported files: its own rule, so re-evaluating never retrains.


rule train_drafter:
    input:
        manifests=expand(LAYOUT.hidden_done(), ds=DATASETS),
        token_stats=expand(LAYOUT.token_stats(), ds=DATASETS),
        model=embedded_target(),
    output:
        config=LAYOUT.drafter_config,
        weights=LAYOUT.drafter_weights,
        report=report(
            LAYOUT.train_report,
            caption="../report/train_json.rst",
            category=REPORT_CATEGORY["drafter"],
        ),
        # The drafters kept along training (drafter.curve_points) for the learning curve; index.json only if 0.
        snapshots=directory(LAYOUT.snapshots),
    params:
        # The folder SGLang and vLLM load: the declared config.json and model.safetensors are its files.
        drafter_dir=lambda wildcards, output: str(Path(output.config).parent),
        # Undeclared, like the shards: a killed training resumes from it; removed once the drafter is out.
        checkpoint_dir=str(LAYOUT.drafter_checkpoints),
        target=TARGET_DIR,
        settings={k: v for k, v in config["drafter"].items() if k not in ("gpus", "export_speculators")},
        datasets=DATASETS,  # one per manifests input, in their order (for drafter.set_weights)
        holdout_per_dataset=config["eval"]["holdout_per_dataset"],
        holdout_ids=config["eval"]["holdout_ids"],
    log:
        LAYOUT.log("train_drafter.log"),
    threads: CLUSTER["train_drafter"]["cpus"]
    resources:
        gpu=config["drafter"]["gpus"],
        **gpu_model(config["drafter"]["gpus"]),
        mem_mb=CLUSTER["train_drafter"]["mem_mb"],
        runtime=CLUSTER["train_drafter"]["runtime_min"],
    conda:
        "../envs/gpu.yaml"
    script:
        "../scripts/train_drafter.py"


# 4a. How to carry the drafter to a serving node and serve it: its README and the target it was trained
#     against, named as engines and hubs know it (target.name), not by this node's path.
rule describe_drafter:
    input:
        config=LAYOUT.drafter_config,
    output:
        serving=LAYOUT.drafter_serving,
        target=LAYOUT.drafter_target,
    params:
        target=target_reference(),
        num_speculative_tokens=config["eval"]["num_steps"],
    log:
        LAYOUT.log("describe_drafter.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/describe_drafter.py"


rule evaluate_drafter:
    input:
        config=LAYOUT.drafter_config,
        weights=LAYOUT.drafter_weights,
        report=LAYOUT.train_report,
        tokens=expand(LAYOUT.tokens(), ds=DATASETS),
        token_stats=expand(LAYOUT.token_stats(), ds=DATASETS),
        model=embedded_target(),
    output:
        eval=report(
            LAYOUT.evaluation,
            caption="../report/eval_json.rst",
            category=REPORT_CATEGORY["drafter"],
        ),
    params:
        drafter_dir=lambda wildcards, input: str(Path(input.config).parent),
        target=TARGET_DIR,
        settings=config["eval"],
        datasets=DATASETS,  # one per tokens/token_stats input, in their order
    log:
        LAYOUT.log("evaluate_drafter.log"),
    threads: CLUSTER["evaluate_drafter"]["cpus"]
    resources:
        gpu=min(config["drafter"]["gpus"], 1),
        **gpu_model(min(config["drafter"]["gpus"], 1)),
        mem_mb=CLUSTER["evaluate_drafter"]["mem_mb"],
        runtime=CLUSTER["evaluate_drafter"]["runtime_min"],
    conda:
        "../envs/gpu.yaml"
    script:
        "../scripts/evaluate_drafter.py"


# 4b. The same drafter in vLLM speculators' own format (drafter.export_speculators): a conversion, so
#     exporting it never retrains.
rule export_speculators:
    input:
        config=LAYOUT.drafter_config,
        weights=LAYOUT.drafter_weights,
        target=LAYOUT.drafter_target,
        model=embedded_target(),
    output:
        config=LAYOUT.speculators_config,
        weights=LAYOUT.speculators_weights,
        target=LAYOUT.speculators_target,
    params:
        drafter_dir=lambda wildcards, input: str(Path(input.config).parent),
        out_dir=lambda wildcards, output: str(Path(output.config).parent),
        target=TARGET_DIR,
        num_speculative_tokens=config["eval"]["num_steps"],
    log:
        LAYOUT.log("export_speculators.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/export_speculators.py"


# 6. The learning curve: acceptance on the held-out prompts of the drafters kept along training
#    (drafter.curve_points), beside the untrained drafter and prompt lookup. Asked for only when they are kept.
rule drafter_curve:
    input:
        snapshots=LAYOUT.snapshots,
        config=LAYOUT.drafter_config,
        weights=LAYOUT.drafter_weights,
        report=LAYOUT.train_report,
        tokens=expand(LAYOUT.tokens(), ds=DATASETS),
        token_stats=expand(LAYOUT.token_stats(), ds=DATASETS),
        model=embedded_target(),
    output:
        curve=report(
            LAYOUT.curve,
            caption="../report/curve_json.rst",
            category=REPORT_CATEGORY["drafter"],
        ),
    params:
        drafter_dir=lambda wildcards, input: str(Path(input.config).parent),
        target=TARGET_DIR,
        settings=config["eval"],
        datasets=DATASETS,  # one per tokens/token_stats input, in their order
    log:
        LAYOUT.log("drafter_curve.log"),
    threads: CLUSTER["evaluate_drafter"]["cpus"]
    resources:
        gpu=min(config["drafter"]["gpus"], 1),
        **gpu_model(min(config["drafter"]["gpus"], 1)),
        mem_mb=CLUSTER["evaluate_drafter"]["mem_mb"],
        runtime=CLUSTER["evaluate_drafter"]["runtime_min"],
    conda:
        "../envs/gpu.yaml"
    script:
        "../scripts/drafter_curve.py"
