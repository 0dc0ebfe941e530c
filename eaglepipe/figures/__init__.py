"""What a person looks at after a run: figures for the Snakemake report and the end-of-run table.

Everything here reads the stages' declared outputs (and the run-wide ledger) and writes nothing back.
"""

# Every figure's file stem (results/figures/{stem}.png, caption report/{stem}.rst); its first word names the
# stage whose outputs it shows. Kept here, apart from matplotlib, because the Snakefile reads it to plan.
FIGURES = (
    "generation_answer_lengths",
    "generation_finish_reasons",
    "generation_spend",
    "tokens_id_methods",
    "tokens_billed_difference",
    "tokens_yield",
    "hidden_states",
    "drafter_training",
    "drafter_acceptance",
    "drafter_acceptance_by_position",
)
