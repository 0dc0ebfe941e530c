# 6. What a person looks at: figures for `snakemake --report {results}/report.html`, drawn from the stages'
# declared outputs and the run-wide ledger; the end-of-run table (onsuccess) and one line per failed job
# (onerror) on the terminal.

rule figures:
    input:
        responses=expand(LAYOUT.responses(), ds=DATASETS),
        token_stats=expand(LAYOUT.token_stats(), ds=DATASETS),
        manifests=expand(LAYOUT.hidden_done(), ds=DATASETS),
        train=LAYOUT.train_report,
        eval=LAYOUT.evaluation,
    output:
        **{stem: figure(stem) for stem in FIGURES},
        table=LAYOUT.run_summary,
        # The same table as a web page: the report shows it in place, where a .txt is only a download.
        page=report(
            LAYOUT.run_summary_page,
            caption="../report/run_summary.rst",
            category=REPORT_CATEGORY["run"],
        ),
    params:
        datasets=DATASETS,
        # Undeclared outputs of generation (see rules/generate.smk), read when present.
        summaries=expand(LAYOUT.responses_summary(), ds=DATASETS),
        ledger=str(LAYOUT.ledger),
        budget_usd=config["budget"]["usd"],
        max_tokens=config["generation"]["max_tokens"],
        emulated=LOCAL_API,
    log:
        LAYOUT.log("figures.log"),
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/figures.py"


onsuccess:
    from eaglepipe.figures.data import load_run
    from eaglepipe.figures.summary import run_table, stage_times, stopped_short_note
    from eaglepipe.plan import same_configuration

    run = load_run(
        DATASETS,
        summaries=expand(LAYOUT.responses_summary(), ds=DATASETS),
        token_stats=expand(LAYOUT.token_stats(), ds=DATASETS),
        manifests=expand(LAYOUT.hidden_done(), ds=DATASETS),
        evaluation=LAYOUT.evaluation,
    )
    print(run_table(run, emulated=LOCAL_API), file=sys.stderr)
    for line in (stage_times(log), stopped_short_note(sys.argv)):
        if line:
            print(line, file=sys.stderr)
    # The configuration this run was started with, so the report reads the same results root.
    options = same_configuration(sys.argv)
    if options is None:  # started through the Python API: the config files Snakemake read
        options = "".join(f" --configfile {path}" for path in workflow.overwrite_configfiles)
    print(f"eaglepipe: the report: .venv/bin/snakemake{options} --report {LAYOUT.report}", file=sys.stderr)


onerror:
    from eaglepipe.figures.summary import failed_jobs

    for line in failed_jobs(log):
        print(line, file=sys.stderr)
