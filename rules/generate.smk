# 1. Generation, the stage that spends money: a set's answers, bought through OpenRouter (generate), asked of
# the team's own engine (generate_engine) or imported (import_answers). One script and one job description
# (eaglepipe.answers) for all three; the `source` param picks the source. Progress lives in
# {results}/{ds}/.journal/ (undeclared, so a failed or killed job never loses a paid response);
# responses.jsonl is written once, atomically, at the end.


# How a generate job runs and reaches its server (eaglepipe.openrouter.settings.operational_params:
# concurrency, retries, timeouts, breaker, probe, stream, the key file's path, the target directory). A
# change reruns this rule only: generate takes its file as an ancient input, so the change holds for the
# next set to run and reruns no finished one. What shapes the answers is generate's own `request` param.
rule generation_settings:
    output:
        settings=LAYOUT.generation_settings,
    params:
        operational=operational_params(config),
    log:
        job=LAYOUT.log("generation_settings.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/generation_settings.py"


rule providers:
    input:
        model=embedded_target() if LOCAL_API else [],
    output:
        providers=report(
            LAYOUT.providers,
            caption="../report/providers_json.rst",
            category=REPORT_CATEGORY["generation"],
        ),
    params:
        model=config["api"]["model"],
        base_url=config["api"]["base_url"],
        routing=config["routing"],
        max_tokens=config["generation"]["max_tokens"],
        # How the job reaches the server; the key file's path, never the key.
        key_file=config["api"]["key_file"],
        key_file_env=config["api"]["key_file_env"],
        emulator_text_like=config["api"]["emulator_text_like"],
        target_path=TARGET_DIR,
    log:
        job=LAYOUT.log("providers.log"),
        **emulator_log(LAYOUT.log("providers.emulator.log")),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/providers.py"


rule generate:
    wildcard_constraints:
        ds=sets_pattern(BOUGHT_SETS),
    input:
        prompts=LAYOUT.prompt_set(),
        # ancient: refreshing the endpoint list alone must not re-buy responses.
        providers=ancient(LAYOUT.providers),
        # ancient: operational settings (concurrency, retries, ...) must not rerun a finished set either.
        settings=generation_settings_input,
        model=embedded_target() if LOCAL_API else [],
    output:
        responses=LAYOUT.responses(),
    params:
        # Not a rerun trigger (eaglepipe.config_types.Source): the config's choice of source picks the rule.
        source=Source.OPENROUTER,
        # Only what changes the responses or completes a set belongs here: a change reruns the (paid) job,
        # which then resumes from the journal. Everything else comes from the settings input.
        fingerprint=GENERATION_FINGERPRINT,
        # Read from here, so that a set answered before the file existed can run without it as an input.
        settings=str(LAYOUT.generation_settings),
        # The answer-shaping config the fingerprint hashes (eaglepipe.openrouter.settings.request_params).
        request=request_params(config),
        output_token_budget=config["budget"]["output_tokens_per_dataset"],
        # The dollars the set may spend (eaglepipe.openrouter.dollars): a change of budget.usd or
        # budget.policy reruns only the sets it can buy more for.
        dollar_budget=set_dollar_budget,
        max_failed_fraction=config["generation"]["max_failed_fraction"],
        journal=str(LAYOUT.journal()),
        # Undeclared, like the journal: a failed job keeps the summary that says why it failed.
        summary=str(LAYOUT.responses_summary()),
        # The run-wide ledger and heartbeats, shared by every generation job of this results root.
        ledger=str(LAYOUT.ledger),
    log:
        job=LAYOUT.log("generate/{ds}.log"),
        **emulator_log(LAYOUT.log("generate/{ds}.emulator.log")),
    localrule: True
    # Jobs running at once split generation.concurrency and share budget.usd through the ledger;
    # the local profile limits api to the jobs its cores can run, each with its own emulator.
    resources:
        api=1,
    # The client needs little CPU, and a local emulator's model runs on one thread: two sets at once, one
    # thread each, decode 27% more tokens per second than one set on two threads (docs/generation.md).
    threads: 1
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/answers.py"


# A set answered by the team's own vLLM or SGLang server (`answers`, `engine`): the same client, journal and
# resume as a bought set; the job starts the server on the target with its GPUs unless engine.base_url names
# a running one, and every answer keeps the ids the engine produced.
rule generate_engine:
    wildcard_constraints:
        ds=sets_pattern(ENGINE_SETS),
    input:
        prompts=LAYOUT.prompt_set(),
        settings=generation_settings_input,
        model=embedded_target(),
    output:
        responses=LAYOUT.responses(),
    params:
        source=Source.ENGINE,
        fingerprint=ENGINE_FINGERPRINT,
        settings=str(LAYOUT.generation_settings),
        request=engine_request_params(config),
        output_token_budget=config["budget"]["output_tokens_per_dataset"],
        max_failed_fraction=config["generation"]["max_failed_fraction"],
        journal=str(LAYOUT.journal()),
        summary=str(LAYOUT.responses_summary()),
        ledger=str(LAYOUT.engine_ledger),
    log:
        job=LAYOUT.log("generate/{ds}.log"),
        engine=LAYOUT.log("generate/{ds}.engine.log"),
    # A local engine's threads: a running server's job needs one, a started one the node's CPUs.
    threads: 1 if config["engine"]["base_url"] else CLUSTER["generate_engine"]["cpus"]
    resources:
        gpu=engine_gpus(),
        **gpu_model(engine_gpus()),
        mem_mb=CLUSTER["generate_engine"]["mem_mb"],
        runtime=CLUSTER["generate_engine"]["runtime_min"],
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/answers.py"


# A set whose answers the team already has (`answers.sets.{ds}: {source: import, path: ...}`): its prompts'
# answers are taken from the file (docs/formats.md), nothing is asked or bought.
rule import_answers:
    wildcard_constraints:
        ds=sets_pattern(IMPORTED_SETS),
    input:
        prompts=LAYOUT.prompt_set(),
        answers=imported_answers,
    output:
        responses=LAYOUT.responses(),
    params:
        source=Source.IMPORT,
        summary=str(LAYOUT.responses_summary()),
        output_token_budget=config["budget"]["output_tokens_per_dataset"],
        target_name=config["target"]["name"],
    log:
        job=LAYOUT.log("generate/{ds}.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/answers.py"
