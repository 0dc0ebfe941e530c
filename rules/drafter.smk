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
        report=results("drafter/train.json"),
        serving=results("drafter/README.md"),
    params:
        target=TARGET_DIR,
        # What shapes the drafter; where it trains (device, gpus) is read from the config by the script.
        settings={k: v for k, v in config["drafter"].items() if k not in ("device", "gpus")},
        holdout_per_dataset=config["eval"]["holdout_per_dataset"],
        holdout_ids=config["eval"]["holdout_ids"],
    log:
        logs("train_drafter.log"),
    threads: 2
    resources:
        gpu=config["drafter"]["gpus"],
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
        eval=results("drafter/eval.json"),
    params:
        target=TARGET_DIR,
        datasets=DATASETS,  # one per tokens/token_stats input, in their order
        # What is measured; where it runs (eval.device, eval.dtype) is read from the config by the script.
        settings={k: v for k, v in config["eval"].items() if k not in ("device", "dtype")},
    log:
        logs("evaluate_drafter.log"),
    threads: 2
    resources:
        gpu=min(config["drafter"]["gpus"], 1),
    conda:
        "../envs/gpu.yaml"
    script:
        "../scripts/evaluate_drafter.py"
