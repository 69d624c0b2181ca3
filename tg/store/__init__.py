"""What a run writes: result CSVs, its run directory, its per-step metrics.

    files.py      result CSVs that survive concurrent writers and interruption (`append_csv_rows`)
    rundir.py     a run directory: one owner at a time (lock), its checkpoint and config
    reporters.py  `--report-to tensorboard`: each step's metrics as TensorBoard scalars
"""
