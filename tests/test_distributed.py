"""Training over two ranks (gloo, CPU) equals one process over the same global batch (tg.gpu.distributed): DDP for
full fine-tuning and LoRA, FSDP2 for full fine-tuning; a rank that dies stops the other with a clear error and
the run resumes exactly; one process resumes a two-rank run. The ranks are two spawned processes that join
the group from torchrun's environment variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

import faulthandler
import json
import multiprocessing
import os
import signal
import socket
from pathlib import Path

import pytest
import torch

from tg.config import load_config
from tg.config_values import ConfigError
from tg.gpu.distributed import Parallel, merge_scores, minibatch_of, shard_seed, shard_slices, with_shards

TOL = 1e-4
"""Max |weight difference| after two steps (four AdamW updates at lr 1e-3) between two ranks and one process:
float summation order only (the rollouts are identical), which AdamW's per-element normalisation magnifies in
near-zero gradient elements to a share of the step size lr. Measured: 4.0e-5 with packed trees (the cpu
default: each rank packs its own micro-batches), 3.1e-6 with `optim.pack_trees=false`."""


def _cfg(finetune: str, **optim):
    o = dict(steps=2, prompts_per_step=4, mini_batch_prompts=2, micro_batch_rows=3, lr=1e-3, checkpoint_every=1,
             rollout_shards=2, kl_beta=0.01)
    o.update(optim)
    return load_config("cpu").replace(model=dict(finetune=finetune, lora_r=4, lora_alpha=8),
                                      agent=dict(max_turns=2, max_step_tokens=40), tree=dict(M=2, N=1, L=1), optim=o)


def _trainer(c, run_dir, parallel=None):
    from transformers import AutoTokenizer

    from tg.agent.data import load_split
    from tg.agent.env import SearchEnv
    from tg.agent.finetune import trainable_policy
    from tg.agent.retrieval import CachedRetriever, bm25_for
    from tg.agent.warmup import warmed_up_policy
    from tg.agent.world import ensure_world
    from tg.trainer import Trainer
    world = ensure_world(c.data, c.cache_dir)
    policy = warmed_up_policy(load_config("cpu"))
    tok = AutoTokenizer.from_pretrained(policy)
    env = SearchEnv(tok, CachedRetriever(bm25_for(world / "corpus.jsonl")), top_k=3, max_obs_tokens=500, max_turns=2)
    torch.manual_seed(c.optim.seed)
    return Trainer(c, trainable_policy(policy, c.model, torch.device("cpu")), tok, env, load_split(world, "train"),
                   run_dir, parallel=parallel)


def _rank(rank: int, port: int, jobs: list[dict], out: str) -> None:
    """One rank: run each job (a config, a run directory, steps, resume; `die`: this rank exits at that step)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, file=open(Path(out, f"rank{rank}.stacks"), "a"))  # see _launch
    from tg.gpu.distributed import RankLostError
    from tg.gpu.launch import start
    for job in jobs:
        c = _cfg(job["finetune"], parallel=job.get("parallel", "auto"))
        tr = _trainer(c, job["run_dir"], start(c))
        if job.get("die") is not None and rank == 1:
            step = tr.step
            tr.step = lambda: os._exit(3) if tr.step_done + 1 == job["die"] else step()
        try:
            rows = tr.fit(resume=job.get("resume", False), progress=False)
        except RankLostError as err:
            Path(out, f"{job['name']}.err").write_text(str(err))
            return
        weights = tr.par.model_state(tr.policy)
        if rank == 0:
            torch.save({"weights": weights, "rows": rows, "kind": type(tr.par).__name__}, Path(out, f"{job['name']}.pt"))
    tr.par.close()


def _launch(jobs: list[dict], out: Path) -> list[int]:
    """Two ranks running `jobs`; their exit codes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, jobs, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    codes = [p.exitcode for p in procs]
    for r, p in enumerate(procs):                        # a hung rank is reported as None, its stacks printed
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
            p.join(timeout=5)
            print(f"rank {r} hung; its threads' stacks:\n" + Path(out, f"rank{r}.stacks").read_text())
            p.kill()
    return codes


def _single(finetune: str, run_dir: Path, resume: bool = False) -> tuple[dict, list[dict]]:
    from tg.store.reporters import reporters
    tr = _trainer(_cfg(finetune), run_dir)
    tr.reporters = reporters(["tensorboard"], run_dir)
    rows = tr.fit(resume=resume, progress=False)
    return {k: v.clone() for k, v in tr.policy.state_dict().items()}, rows


def _max_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


EXACT = ("reward", "em", "format_valid", "tool_calls", "tool_calls_per_traj", "generated", "prefill", "prefill_saved",
         "trajectories", "zero_std_intra", "zero_std_inter", "adv_mean", "adv_std", "adv_intra_std", "adv_inter_std",
         "lr")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two ranks: DDP full, DDP LoRA, FSDP2 full, and a DDP full run whose rank 1 dies in step 2, then that run
    resumed by two ranks; one process: full and LoRA with the same two rollout shards."""
    out = tmp_path_factory.mktemp("dist")
    jobs = [dict(name="ddp-full", finetune="full", parallel="ddp", run_dir=str(out / "ddp-full")),
            dict(name="ddp-lora", finetune="lora", run_dir=str(out / "ddp-lora")),
            dict(name="fsdp-full", finetune="full", parallel="fsdp", run_dir=str(out / "fsdp-full")),
            dict(name="killed", finetune="full", parallel="ddp", run_dir=str(out / "killed"), die=2)]
    codes = _launch(jobs, out)
    killed = out / "killed"
    after_kill = ([json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()],
                  torch.load(killed / "checkpoint.pt", weights_only=False)["step"])
    resumed = _launch([dict(name="resumed", finetune="full", parallel="ddp", run_dir=str(out / "killed"),
                            resume=True)], out)
    single = {ft: _single(ft, out / f"single-{ft}") for ft in ("full", "lora")}
    return out, (codes, after_kill), resumed, single


@pytest.mark.parametrize("name, finetune, kind", [("ddp-full", "full", "DataParallel"),
                                                  ("ddp-lora", "lora", "DataParallel"),
                                                  ("fsdp-full", "full", "FullyShardedParallel")])
def test_two_ranks_train_like_one_process(runs, name, finetune, kind):
    out, _, _, single = runs
    got = torch.load(out / f"{name}.pt", weights_only=False)
    weights, rows = single[finetune]
    assert got["kind"] == kind and len(got["rows"]) == 2
    assert all(r["adv_std"] > 0 and r["grad_norm"] > 0 for r in rows)     # the steps did train
    for mine, ref in zip(got["rows"], rows, strict=True):                   # same samples, same advantages
        assert {k: mine[k] for k in EXACT} == {k: ref[k] for k in EXACT}
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    gap = _max_gap(got["weights"], weights)
    print(f"{name}: max |weight gap| {gap:.2g}")
    assert 0 < gap < TOL or gap == 0, gap
    lines = (out / name / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]                 # one metrics file, rank 0's


def test_a_dead_rank_stops_the_job_and_the_run_resumes_exactly(runs):
    out, (codes, after_kill), resumed, _ = runs
    assert codes[1] == 3                                                     # rank 1 died in step 2
    message = (out / "killed.err").read_text()
    assert message.startswith("rank 0: a collective failed") and "--resume" in message
    assert after_kill == ([1], 1)                                            # step 1's metrics and checkpoint kept
    ckpt = torch.load(out / "killed" / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 2 and len(ckpt["rng_ranks"]) == 2
    assert resumed == [0, 0]
    straight = torch.load(out / "ddp-full.pt", weights_only=False)
    again = torch.load(out / "resumed.pt", weights_only=False)
    assert all(torch.equal(again["weights"][k], w) for k, w in straight["weights"].items())
    strip = [[{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]
             for rows in (straight["rows"], again["rows"])]
    assert strip[0] == strip[1]
    lines = (out / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]


def test_one_process_resumes_a_two_rank_run(runs, tmp_path):
    """The world size may change when optim.rollout_shards stays: the same samples, gradients up to float order."""
    import shutil
    out, _, _, single = runs
    run = shutil.copytree(out / "ddp-full", tmp_path / "run")
    (run / "checkpoint.pt").unlink()                                         # back to step 1 (checkpoint.prev.pt)
    weights, rows = _single("full", run, resume=True)
    assert rows[-1]["reward"] == single["full"][1][-1]["reward"]
    assert _max_gap(weights, single["full"][0]) < TOL


def test_shards_split_prompts_and_mini_batches():
    assert shard_slices(8, 4) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    # 8 prompts, 2 shards, mini-batches of 4: each takes 2 prompts of each shard
    assert [minibatch_of(p, 4, 2) for p in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [minibatch_of(p, 8, 4) for p in range(8)] == [0] * 4 + [1] * 4        # one shard: consecutive prompts
    assert shard_seed(17, 0) == 17 and len({shard_seed(17, k) for k in range(4)}) == 4
    assert [list(p.my_shards()) for p in (Parallel(1), Parallel(4))] == [[0], [0, 1, 2, 3]]


def test_scores_merge_with_global_tree_and_prompt_ids():
    a = {"reward": [1.0, 0.0], "tree": [0, 1], "prompt": [0, 0]}
    b = {"reward": [0.5], "tree": [0], "prompt": [0]}
    assert merge_scores([a, b]) == {"reward": [1.0, 0.0, 0.5], "tree": [0, 1, 2], "prompt": [0, 0, 1]}


def test_world_size_sets_or_checks_the_shards():
    cfg = load_config("cpu")
    assert with_shards(cfg, 1) == cfg and with_shards(cfg, 4).optim.rollout_shards == 4
    assert with_shards(cfg.replace(optim=dict(rollout_shards=8)), 4).optim.rollout_shards == 8
    with pytest.raises(ConfigError, match="multiple of the 4 ranks"):
        with_shards(cfg.replace(optim=dict(rollout_shards=2)), 4)
    with pytest.raises(ConfigError, match="optim.rollout_shards"):
        cfg.replace(optim=dict(rollout_shards=3))                            # 16 prompts per mini-batch


def test_the_trainer_reports_each_step_to_tensorboard(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, _, _, single = runs
    acc = EventAccumulator(str(out / "single-full" / "tensorboard"))
    acc.Reload()
    rows = single["full"][1]
    assert [(e.step, e.value) for e in acc.Scalars("train/reward")] == [(r["step"], pytest.approx(r["reward"]))
                                                                       for r in rows]


def test_distributed_and_fsdp_import_alone_and_not_each_other():
    """tg.gpu.fsdp extends tg.gpu.distributed's DDP class; the choice between them is tg.gpu.launch's."""
    import ast
    import subprocess
    import sys
    alone = [subprocess.Popen([sys.executable, "-c", f"import {m}"], cwd=Path(__file__).parents[1])
             for m in ("tg.gpu.distributed", "tg.gpu.fsdp", "tg.gpu.launch")]
    assert [p.wait(timeout=300) for p in alone] == [0, 0, 0]
    tree = ast.parse((Path(__file__).parents[1] / "tg" / "gpu" / "distributed.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "tg.gpu.fsdp" not in imported and "tg.gpu.launch" not in imported


def test_a_backend_error_becomes_rank_lost_and_others_pass():
    from tg.gpu.distributed import RankLostError, failures_as_rank_lost
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    with pytest.raises(RankLostError, match=r"^rank 0: a collective failed \(\[/pytorch/third_party/gloo.*--resume"):
        with failures_as_rank_lost(2):
            raise gloo
    for world, err in [(1, gloo), (2, RuntimeError("shape mismatch")), (2, ValueError("NCCL"))]:
        with pytest.raises(type(err)) as got, failures_as_rank_lost(world):
            raise err
        assert got.value is err


def _rank_fsdp_gather(rank: int, port: int, out: str) -> None:
    """Two ranks shard a small model with FSDP2; rank 1 dies; rank 0 gathers the weights for a rollout."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from types import SimpleNamespace

    from tg.gpu.distributed import RankLostError, failures_as_rank_lost
    from tg.gpu.fsdp import FullyShardedParallel
    torch.distributed.init_process_group("gloo")
    par = FullyShardedParallel(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    model.model = SimpleNamespace(layers=list(model))                        # the decoder layers, as in Qwen2
    policy = SimpleNamespace(model=model, reference=None)
    par.prepare(policy)
    par.barrier()
    if rank == 1:
        os._exit(3)
    try:
        with failures_as_rank_lost(2), par.rollout_context(policy):
            pass
    except RankLostError as err:
        Path(out, "gather.err").write_text(str(err))
    os._exit(0)


def _rank_cli(rank: int, port: int, argv: list[str], out: str) -> None:
    """One rank of `torchrun -m tg ARGV`: its exit status and stderr into OUT/rank-R."""
    import contextlib
    import io
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from tg.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    Path(out, f"rank-{rank}").write_text(f"{code}\n{err.getvalue()}")


def _spawn(target, *args) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [multiprocessing.get_context("spawn").Process(target=target, args=(r, port, *args)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def test_a_rank_lost_while_fsdp_gathers_the_rollout_weights_is_one_clear_error(tmp_path):
    assert _spawn(_rank_fsdp_gather, str(tmp_path)) == [0, 3]
    message = (tmp_path / "gather.err").read_text()
    assert message.startswith("rank 0: a collective failed") and "--resume" in message


def test_a_run_directory_refused_on_rank_0_is_reported_by_rank_0_alone(tmp_path):
    import subprocess
    import sys
    run = tmp_path / "run"
    hold = "import sys; from tg.store.rundir import run_lock\nwith run_lock(sys.argv[1]):\n" \
           "    print('held', flush=True)\n    sys.stdin.read()\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parents[1])
    try:
        assert holder.stdout.readline() == "held\n"
        assert _spawn(_rank_cli, ["train", "--method", "tree", "--run-dir", str(run)], str(tmp_path)) == [0, 0]
    finally:
        holder.kill()
        holder.wait()
    code0, *err0 = (tmp_path / "rank-0").read_text().splitlines()
    code1, *err1 = (tmp_path / "rank-1").read_text().splitlines()
    assert code0 == "2" and len(err0) == 1 and f"in use by process {holder.pid}" in err0[0]
    assert code1 == "1" and err1 == []
