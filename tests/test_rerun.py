"""A committed grid row, rerun: the first steps of one committed training run, retrained from its pinned start
by `tg mini rerun`, give the committed per-step metrics. On the machine kind that made the row (CPU and torch's
vector ISA, recorded in it) every metric is equal to the last bit, so the sampled tokens and the trained weights
are too; this is what keeps a refactor of the rollout or the update honest. On another kind float sums differ:
the first rollout, sampled from the same pinned weights, still gives the committed token counts and rewards
(a sampled token flips only when a draw falls within float noise of a boundary), and the first update's
metrics agree to float precision. The caller's torch thread count does not matter: the rerun trains with the
grid's (`tg.experiments.mini.GRID_THREADS`), and the test calls it from a process set to another count."""

import pytest
import torch

from tg.agent.warmup import machine
from tg.agent.world import REPO_ROOT
from tg.experiments import rerun
from tg.experiments.mini import GRID_THREADS

GRID = REPO_ROOT / "results" / "mini" / "budget.csv"
CELL, SEED, STEPS = "multi-hop/moderate/tree", 0, 2
ROLLOUT = ("reward", "em", "format_valid", "tool_calls", "tool_calls_per_traj", "generated", "prefill",
           "prefill_saved", "trajectories", "zero_std_intra", "zero_std_inter", "adv_mean", "adv_std")
UPDATE = ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm")


def test_the_first_steps_of_a_committed_run_come_out_as_committed(tmp_path):
    lines: list[str] = []
    before = torch.get_num_threads()
    torch.set_num_threads(GRID_THREADS + 1)
    try:
        result = rerun.rerun(GRID, CELL, SEED, steps=STEPS, run_dir=tmp_path, out=lines.append)
        assert torch.get_num_threads() == GRID_THREADS + 1  # the caller's count, restored
    finally:
        torch.set_num_threads(before)
    made_on = next(iter(result.committed.rows.values()))["machine"]
    assert [m["step"] for m in result.steps] == list(range(1, STEPS + 1))
    if made_on == machine():
        assert result.equal, "\n".join(lines)
        return
    first, committed = result.steps[0], result.committed.steps[1]
    assert {k: first[k] for k in ROLLOUT} == {k: float(committed[k]) for k in ROLLOUT}, "\n".join(lines)
    for k in UPDATE:
        assert first[k] == pytest.approx(float(committed[k]), rel=1e-3, abs=1e-6), k
