# 3. Hidden states: the target run over the token ids. Shards go to {results}/{ds}/hidden/ (undeclared, so a
# killed extraction resumes from finished shards); the manifest hidden.done is the declared output.
# params hold what changes the states; how they are computed and stored (device, batch and shard sizes)
# is read from the config in the script, so changing it reruns nothing.


rule hidden:
    input:
        tokens=results("{ds}/tokens.safetensors"),
        stats=results("{ds}/tokens.json"),
        model=embedded_target(),
    output:
        manifest=results("{ds}/hidden.done"),
    params:
        target=TARGET_DIR,
        target_name=config["target"]["name"],
        shard_dir=results("{ds}/hidden"),
        aux_layers=config["hidden"]["aux_layers"],
        dtype=config["hidden"]["dtype"],
    log:
        logs("hidden/{ds}.log"),
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
