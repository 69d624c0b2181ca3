"""What is run with the algorithm and read back: the demo, the miniature grids, their statistics, lessons.

The grids in reading order: what a grid is and where its rows go, how the rows are made, how they are judged, how
they are reported (the imports between these modules form no cycle: tests/test_layout.py).

    cells.py           a grid's vocabulary: a cell (overrides, seeds, evaluation points), the two starts, shapes
    mini.py            the paper's claims in miniature: the named experiment grids (`tg mini list`)
    grid_files.py      a grid's files: rows, per-step metrics, per-question outcomes; the jobs still missing
    runner.py          `tg mini run`: a grid's missing rows in worker processes
    measure.py         what one (cell, seed) job measures: its rows
    rerun.py           `tg mini rerun`, `tg mini compare`: committed rows made again and compared
    verdict.py         paired and one-sided t-tests, Holm's correction, two-look levels, the verdict rule (scipy)
    claims.py          the declared comparisons and their verdicts: the claims table
    confirm.py         the confirmatory experiment's declared protocol and rule (its cells, its verdicts)
    summary.py         the grids' rows read back as tables
    confirm_report.py  the confirmatory experiment's report
    report.py          `tg mini report`: every grid's report, the generated blocks of the READMEs

Beside them: demo.py (`make demo`), plots.py (trees and learning curves), lesson.py and exercises.py (the
notebooks' set-up and self-checking exercises).
"""
