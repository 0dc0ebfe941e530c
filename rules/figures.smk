# 6. What a person looks at: figures for `snakemake --report {results}/report.html`, drawn from the stages'
# declared outputs and the run-wide ledger; the end-of-run table (onsuccess) and one line per failed job
# (onerror) on the terminal.

rule figures:
    input:
        responses=expand(results("{ds}/responses.jsonl"), ds=DATASETS),
        token_stats=expand(results("{ds}/tokens.json"), ds=DATASETS),
        manifests=expand(results("{ds}/hidden.done"), ds=DATASETS),
        train=results("drafter/train.json"),
        eval=results("drafter/eval.json"),
    output:
        **{stem: figure(stem) for stem in FIGURES},
        table=report(
            results("figures/run_summary.txt"),
            caption="../report/run_summary.rst",
            category=REPORT_CATEGORY["run"],
        ),
    params:
        datasets=DATASETS,
        # Undeclared outputs of generation (see rules/generate.smk), read when present.
        summaries=expand(results("{ds}/responses.summary.json"), ds=DATASETS),
        ledger=LEDGER_DIR,
        budget_usd=config["budget"]["usd"],
        max_tokens=config["generation"]["max_tokens"],
        emulated=LOCAL_API,
    log:
        logs("figures.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/figures.py"


onsuccess:
    from eaglepipe.figures.data import load_run
    from eaglepipe.figures.summary import run_table

    run = load_run(
        DATASETS,
        summaries=expand(results("{ds}/responses.summary.json"), ds=DATASETS),
        token_stats=expand(results("{ds}/tokens.json"), ds=DATASETS),
        manifests=expand(results("{ds}/hidden.done"), ds=DATASETS),
        evaluation=results("drafter/eval.json"),
    )
    print(run_table(run, emulated=LOCAL_API), file=sys.stderr)
    # The configuration this run used (a profile's configfile counts), so the report reads the same root.
    config_args = "".join(f" --configfile {path}" for path in workflow.overwrite_configfiles)
    print(f"eaglepipe: the report: snakemake{config_args} --report {results('report.html')}", file=sys.stderr)


onerror:
    from eaglepipe.figures.summary import failed_jobs

    for line in failed_jobs(log):
        print(line, file=sys.stderr)
