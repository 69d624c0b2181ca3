"""What is run with the algorithm and read back: the demo, the miniature grids, their statistics, lessons.

    demo.py     `make demo`: chain GRPO vs Tree-GRPO at equal budget
    mini.py     the paper's claims in miniature: named experiment grids (`tg mini`) and their files
    runner.py   `tg mini run`: a grid's missing rows in worker processes; measure.py: what a row holds
    rerun.py    `tg mini rerun`: retrain one committed row beside its committed per-step metrics
    summary.py  the grids' rows read back as tables; claims.py: the declared comparisons and verdicts
    verdict.py  paired and one-sided t-tests, Holm's correction, two-look levels, the verdict rule (scipy)
    confirm.py  the confirmatory experiment's declared protocol and rule; confirm_report.py: its report
    report.py   `tg mini report`: the report blocks of results/mini/README.md
    plots.py    trees and learning curves drawn for the notebooks and the demo
    lesson.py   the notebooks' set-up in one call and their self-checking exercises
"""
