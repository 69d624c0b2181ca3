"""`make demo` end to end on a shortened schedule: both methods trained side by side (two worker processes),
rows for the start and both methods in results/demo.csv, the figure, and the README's table generated from them."""

import pandas as pd

from tg.experiments.demo import run_demo
from tg.experiments.summary import demo_table


def test_demo_trains_both_methods_and_writes_rows_figure_and_table(cfg, tmp_path, capsys):
    short = cfg.replace(optim=dict(steps=2, prompts_per_step=2, mini_batch_prompts=2, checkpoint_every=2),
                        agent=dict(max_step_tokens=40), eval=dict(n_single=4, n_multi=4))
    summaries = run_demo(short, root=tmp_path)
    assert list(summaries) == ["start (warmed up)", "chain GRPO, G=4", "Tree-GRPO (2,2,1)"]
    assert summaries["chain GRPO, G=4"]["trajectories"] == 4.0 and summaries["Tree-GRPO (2,2,1)"]["trajectories"] == 6.0
    rows = pd.read_csv(tmp_path / "results" / "demo.csv")
    assert list(rows["method"]) == ["start", "chain GRPO (G=4)", "Tree-GRPO (2,2,1) intra+inter"]
    assert list(rows["step"]) == [0, 2, 2] and (rows["n"] == 8).all()
    assert (tmp_path / "figures" / "demo_chain_vs_tree.png").stat().st_size > 0
    runs = sorted((tmp_path / "runs").glob("demo-*"))     # each worker trained its run to the end
    assert len(runs) == 2 and all(len((r / "metrics.jsonl").read_text().splitlines()) == 2 for r in runs)
    table = demo_table(tmp_path / "results" / "demo.csv").splitlines()
    assert len(table) == 5 and table[2].startswith("| start |") and "| 4.0 |" in table[3] and "| 6.0 |" in table[4]
    assert "training and evaluating both:" in capsys.readouterr().out



def test_a_users_demo_and_training_rows_leave_the_checkout_clean():
    """`make demo` writes under runs/demo/ and `tg train` (`tg eval`) appends to results/runs.csv (eval.csv): all
    ignored by git. The committed demo rows and figure are written only with `tg demo --root .`."""
    import subprocess

    from tg.agent.world import resolve
    from tg.experiments.demo import outputs

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=resolve("."), capture_output=True, text=True)

    written = [*outputs(), resolve("results") / "runs.csv", resolve("results") / "eval.csv"]
    assert git("check-ignore", *map(str, written)).stdout.split() == [str(p) for p in written]
    reference = outputs(resolve("."))
    assert git("ls-files", "--error-unmatch", str(reference.rows), str(reference.figure)).returncode == 0
