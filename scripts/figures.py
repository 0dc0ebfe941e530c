"""Snakemake adapter: the report's figures from the stages' outputs."""

from pathlib import Path

from eaglepipe.figures.data import load_run
from eaglepipe.figures.draw import draw_figures
from eaglepipe.figures.summary import run_table, run_table_page
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
    run = load_run(
        snakemake.params.datasets,
        responses=[Path(p) for p in snakemake.input.responses],
        summaries=[Path(p) for p in snakemake.params.summaries],
        token_stats=[Path(p) for p in snakemake.input.token_stats],
        manifests=[Path(p) for p in snakemake.input.manifests],
        ledger_dir=Path(snakemake.params.ledger),
        train=Path(snakemake.input.train),
        evaluation=Path(snakemake.input.eval),
    )
    figures = {name: Path(path) for name, path in snakemake.output.items() if name not in ("table", "page")}
    draw_figures(run, figures, max_tokens=snakemake.params.max_tokens, budget_usd=snakemake.params.budget_usd)
    table = run_table(run, emulated=snakemake.params.emulated)
    Path(snakemake.output.table).write_text(table + "\n")
    Path(snakemake.output.page).write_text(run_table_page(table))
    log.info("figures: %s", ", ".join(str(path) for path in figures.values()))
