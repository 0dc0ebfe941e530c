# 4. Train the EAGLE-3 drafter on every set's shards except the held-out prompts, export it for SGLang/vLLM.
# 5. Evaluate it from the exported files: its own rule, so re-evaluating never retrains.


rule train_drafter:
    input:
        manifests=expand(results("{ds}/hidden.done"), ds=DATASETS),
        token_stats=expand(results("{ds}/tokens.json"), ds=DATASETS),
        model=embedded_target(),
    output:
        config=results("drafter/config.json"),
        weights=results("drafter/model.safetensors"),
        report=report(
            results("drafter/train.json"),
            caption="../report/train_json.rst",
            category=REPORT_CATEGORY["drafter"],
        ),
        serving=results("drafter/README.md"),
        # The drafters kept along training (drafter.curve_points) for the learning curve; index.json only if 0.
        snapshots=directory(results("drafter/snapshots")),
    params:
        # The folder SGLang and vLLM load: the declared config.json and model.safetensors are its files.
        drafter_dir=lambda wildcards, output: str(Path(output.config).parent),
        # Undeclared, like the shards: a killed training resumes from it; removed once the drafter is out.
        checkpoint_dir=results(".checkpoints/drafter"),
        target=TARGET_DIR,
        settings={k: v for k, v in config["drafter"].items() if k not in ("gpus", "export_speculators")},
        datasets=DATASETS,  # one per manifests input, in their order (for drafter.set_weights)
        holdout_per_dataset=config["eval"]["holdout_per_dataset"],
        holdout_ids=config["eval"]["holdout_ids"],
    log:
        logs("train_drafter.log"),
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


rule evaluate_drafter:
    input:
        config=results("drafter/config.json"),
        weights=results("drafter/model.safetensors"),
        report=results("drafter/train.json"),
        tokens=expand(results("{ds}/tokens.safetensors"), ds=DATASETS),
        token_stats=expand(results("{ds}/tokens.json"), ds=DATASETS),
        model=embedded_target(),
    output:
        eval=report(
            results("drafter/eval.json"),
            caption="../report/eval_json.rst",
            category=REPORT_CATEGORY["drafter"],
        ),
    params:
        drafter_dir=lambda wildcards, input: str(Path(input.config).parent),
        target=TARGET_DIR,
        settings=config["eval"],
        datasets=DATASETS,  # one per tokens/token_stats input, in their order
    log:
        logs("evaluate_drafter.log"),
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
        config=results("drafter/config.json"),
        weights=results("drafter/model.safetensors"),
        model=embedded_target(),
    output:
        config=results("drafter/speculators/config.json"),
        weights=results("drafter/speculators/model.safetensors"),
    params:
        drafter_dir=lambda wildcards, input: str(Path(input.config).parent),
        out_dir=lambda wildcards, output: str(Path(output.config).parent),
        target=TARGET_DIR,
        num_speculative_tokens=config["eval"]["num_steps"],
    log:
        logs("export_speculators.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/export_speculators.py"


# 6. The learning curve: acceptance on the held-out prompts of the drafters kept along training
#    (drafter.curve_points), beside the untrained drafter and prompt lookup. Asked for only when they are kept.
rule drafter_curve:
    input:
        snapshots=results("drafter/snapshots"),
        config=results("drafter/config.json"),
        weights=results("drafter/model.safetensors"),
        report=results("drafter/train.json"),
        tokens=expand(results("{ds}/tokens.safetensors"), ds=DATASETS),
        token_stats=expand(results("{ds}/tokens.json"), ds=DATASETS),
        model=embedded_target(),
    output:
        curve=report(
            results("drafter/curve.json"),
            caption="../report/curve_json.rst",
            category=REPORT_CATEGORY["drafter"],
        ),
    params:
        drafter_dir=lambda wildcards, input: str(Path(input.config).parent),
        target=TARGET_DIR,
        settings=config["eval"],
        datasets=DATASETS,  # one per tokens/token_stats input, in their order
    log:
        logs("drafter_curve.log"),
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
