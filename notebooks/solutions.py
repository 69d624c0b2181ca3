"""Worked answers to the notebooks' exercises, keyed by exercise id. Try each exercise first.

A notebook's self-check cell starts with `tg.lesson.exercise(id, *answers)`. A blank answer (`...`)
stops that cell with "not answered yet", unless TG_SOLUTIONS=1 (set by the test runner: the
repository's `conftest.py` and the Makefile); then the blank is filled from here, so CI runs every
check against a worked answer. A value is the answer (a tuple when the exercise asks for several);
a callable receives the keyword arguments the notebook passes to `exercise`.
"""

SOLUTIONS = {
    # 01: "The city of {g}, in {other}." normalises to [city, of, g, in, other]: 5 words, 1 shared with the
    # one-word gold. P = 1/5, R = 1/1, F1 = 2 (1/5) (1) / (1/5 + 1) = 1/3.
    "01-f1": (1 / 5, 1.0, 1 / 3),
}
