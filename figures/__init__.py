"""The figures of `tg`: one script per figure, each reading only CSVs under `results/` and writing
one PNG into `figures/` (results are data, figures are code). `python -m figures` redraws them all; see
figures/README.md for which paper table each one draws and from which files."""

SCRIPTS = ("fig_tree_advantages", "fig_table1_qa", "fig_table2_web", "fig_table3_budget", "fig_table4_ablation",
           "fig_table6_granularity", "fig_table7_shapes", "fig_demo", "fig_mini_budget", "fig_mini_ledger",
           "fig_mini_sweep", "fig_mini_theory", "fig_mini_branching", "fig_mini_confirm")
"""Every figure script, the method first, then in the paper's order; `python -m figures` runs each one's `draw`."""
