# 3. Hidden states: the target run over the token ids, by the backend in hidden.backend. Shards go to
# {results}/{ds}/hidden/ (undeclared: each is checksummed beside itself, so a killed extraction resumes from
# the finished ones); the manifest hidden.done is the declared output. Every setting is a param: changing
# how shards are cut or where vLLM lives reruns the job, which then reuses every shard whose key still holds.


rule hidden:
    input:
        tokens=LAYOUT.tokens(),
        stats=LAYOUT.token_stats(),
        model=embedded_target(),
    output:
        manifest=LAYOUT.hidden_done(),
    params:
        target=TARGET_DIR,
        target_name=config["target"]["name"],
        shard_dir=str(LAYOUT.shards()),
        settings=config["hidden"],
    log:
        LAYOUT.log("hidden/{ds}.log"),
    threads: CLUSTER["hidden"]["cpus"]
    resources:
        gpu=config["hidden"]["gpus"],
        **gpu_model(config["hidden"]["gpus"]),
        mem_mb=CLUSTER["hidden"]["mem_mb"],
        runtime=CLUSTER["hidden"]["runtime_min"],
    conda:
        "../envs/gpu.yaml"
    script:
        "../scripts/hidden.py"
