"""What the `tg` commands do (the CLI parses, this module runs and prints); the run API they call is `tg.pipeline`."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tg.agent.finetune import default_device, trainable_policy
from tg.agent.world import resolve
from tg.config import Config, ConfigError
from tg.config_groups import SMOL_NAME
from tg.evaluate import EvalResult, result_row
from tg.gpu.distributed import Parallel
from tg.gpu.launch import start
from tg.pipeline import (build_run, default_run_dir, evaluate_model, load_resources, method_name, policy_source,
                         train_and_evaluate, vllm_engine)
from tg.store.files import append_csv_rows
from tg.store.rundir import RunDirError, check_run_dir, has_checkpoint, read_checkpoint, read_trained, run_lock

if TYPE_CHECKING:
    from tg.gpu.preflight import ModelShape

RESULTS = "results"


def train(cfg: Config, run_dir: Path | None, resume: bool, preflight: bool = True,
          overwrite: bool = False, report_to: str = "none") -> dict | None:
    """Pre-flight (not for the tiny model), train, evaluate every optim.eval_every steps and at the end, and
    append one Table-1-shaped row per evaluation to results/runs.csv. Returns the last row, or None,
    having printed the failing checks, when the pre-flight fails. The run directory is this run's alone
    from the pre-flight on (tg.store.rundir): a run already there is continued only with `resume` (under a
    config that trains the same) and replaced only with `overwrite`. Under torchrun every rank runs it
    (tg.gpu.distributed): rank 0 alone prints, locks, checks and writes; when it refuses the run directory,
    it raises RunDirError and the other ranks return None without a word."""
    from tg.gpu.preflight import format_report, static_checks
    par = start(cfg)
    checked, shape = preflight and cfg.model.name_or_path != "tiny", None
    if checked:
        checks, shape = static_checks(cfg, gpus=par.world)
        if par.is_main:
            print(format_report(checks), flush=True)
        if any(c.failed for c in checks):
            par.close()
            return None
    run_dir = Path(run_dir or default_run_dir(cfg))
    with contextlib.ExitStack() as held:
        refused = None
        if par.is_main:
            try:
                held.enter_context(run_lock(run_dir))
                check_run_dir(run_dir, cfg, resume, overwrite)
            except RunDirError as err:
                refused = err
        # the other ranks start once rank 0 has checked (and, with --overwrite, cleared) it; a refusal ends every
        # rank, and rank 0 alone reports it (the others would report a failed collective)
        if par.gather(refused is not None)[0]:
            par.close()
            if refused is not None:
                raise refused
            return None
        row = _train_in(cfg, run_dir, resume, shape, par, report_to)
    par.close()  # only after success: after an error the other ranks may be gone, and this process exits
    return row


def _train_in(cfg: Config, run_dir: Path, resume: bool, shape: ModelShape | None, par: Parallel,
              report_to: str = "none") -> dict | None:
    """`train` once the run directory is held: with a pre-flight `shape`, the longest sample first (OOM in
    minute one), then train and evaluate. A resumed run that is finished, its last row already in
    results/runs.csv, returns that row: evaluated once, it is one row (one seed) there."""
    from tg.gpu.preflight import check_longest_sample, check_wall_time, format_report
    from tg.store.reporters import reporters
    done = read_checkpoint(run_dir, mmap=True).state["step"] if resume and has_checkpoint(run_dir) else 0
    points = [p for p in cfg.optim.eval_points() if p > done]
    if not points and (row := _recorded(resolve(RESULTS) / "runs.csv", cfg, done)) is not None:
        if par.is_main:
            print(f"{run_dir} is finished (step {done}) and its row is in {RESULTS}/runs.csv: nothing to do", flush=True)
        return row
    run = build_run(cfg, run_dir, par)
    if par.is_main:
        run.trainer.reporters = reporters([report_to], run_dir)
    if shape is not None and torch.cuda.is_available() and par.world == 1:
        longest, tp = check_longest_sample(run.trainer.policy.model, cfg, shape.vocab)
        print(format_report([longest, check_wall_time(cfg, tp)]), flush=True)
        if longest.failed:
            return None
    for step, metrics, result in train_and_evaluate(run, cfg, points or [cfg.optim.steps], resume):
        row = result_row(result, cfg, method=method_name(cfg), model=cfg.model.name_or_path, seed=cfg.optim.seed,
                         step=step)
        if par.is_main:
            append_csv_rows(resolve(RESULTS) / "runs.csv", [row])
            print(json.dumps({"step": step, "train": metrics[-1] if metrics else {}, "eval": result.by_source()},
                             indent=1), flush=True)
    return row


def _recorded(path: Path, cfg: Config, step: int) -> dict | None:
    """The row of `path` (results/runs.csv) that a run of `cfg` wrote at `step` (same config hash and seed), if any."""
    rows = list(csv.DictReader(path.open(newline="", encoding="utf-8-sig"))) if path.exists() else []
    key = (cfg.hash(), str(cfg.optim.seed), str(step))
    return next((r for r in reversed(rows) if (r.get("config_hash"), r.get("seed"), r.get("step")) == key), None)


def evaluate_policy(cfg: Config, policy: str | None, out: Path) -> dict:
    """Evaluate a run directory's checkpoint, a model path, or the preset's starting policy."""
    from transformers import AutoTokenizer
    model_path, checkpoint = policy_source(policy) if policy else (None, None)
    res = load_resources(cfg)
    tok = AutoTokenizer.from_pretrained(res.policy_path)
    tp = trainable_policy(model_path or res.policy_path, cfg.model, default_device())
    step = 0
    if checkpoint:
        loaded = read_trained(checkpoint)
        if loaded.skipped:
            print(f"{loaded.skipped}; evaluating the previous checkpoint {loaded.path}", flush=True)
        tp.load_state_dict(loaded.state["weights"])
        step = loaded.state["step"]
    engine = None
    if cfg.agent.engine == "vllm":  # the rollout engine evaluates too, serving the loaded policy
        engine = vllm_engine(cfg, model_path or res.policy_path, tok)
        engine.sync(tp.model)
    result = evaluate_model(tp.model, tok, res, cfg, engine=engine)
    row = result_row(result, cfg, method=str(policy or "start"), model=cfg.model.name_or_path, seed=cfg.optim.seed,
                     step=step)
    append_csv_rows(out, [row])
    print(json.dumps(row, indent=1))
    return row


def world(cfg: Config) -> None:
    res = load_resources(cfg.replace(warmup=dict(enabled=True)))
    single, multi = res.test_sets(cfg)
    corpus = (res.data_dir / "corpus.jsonl").read_text().splitlines()
    print(f"world: {res.data_dir}\n{len(corpus)} documents, {len(res.train)} train / {len(res.test)} test questions")
    print("a document:", json.loads(corpus[0])["contents"])
    for q in (single[0], multi[0], multi[-1]):
        print(f"[{q.data_source}] {q.question} -> {list(q.golden_answers)}")


def warmup(cfg: Config, rebuild: Path | bool | None = None) -> EvalResult:
    """Load the starting policy (pinned, hash checked), or with `rebuild` train it anew (into the cache, or the
    directory given); print single-hop and multi-hop greedy EM and one transcript."""
    from tg.agent.policy import load_policy
    from tg.agent.smol import build_smol_warmup, warmup_name
    from tg.agent.warmup import build_warmup
    from tg.pipeline import warmup_config
    t0 = time.perf_counter()
    if rebuild is not None and cfg.model.name_or_path == SMOL_NAME:
        if rebuild is not True:
            raise ConfigError("tg warmup --rebuild DIR: the smol start is rebuilt into the cache, where runs find it; "
                              "drop DIR")
        build_smol_warmup(warmup_config(cfg), resolve(cfg.cache_dir) / warmup_name(warmup_config(cfg)))
    elif rebuild is not None:
        built = build_warmup(warmup_config(cfg), None if rebuild is True else rebuild)
        cfg = cfg.replace(model=dict(name_or_path=str(built)))
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    print(f"starting policy: {res.policy_path} ({time.perf_counter() - t0:.0f} s)")
    result = evaluate_model(model, tok, res, cfg)
    print("transcript of the first multi-hop test question:\n" + result.transcripts[len(res.test_sets(cfg)[0])])
    print("greedy EM:", {k: round(v, 3) for k, v in result.by_source().items()})
    return result


def check_throughputs(decode_tps: float | None, train_tps: float | None) -> None:
    """ConfigError unless `tg preflight`'s --decode-tps and --train-tps are both left out (measured) or both given as
    positive finite tokens per second."""
    for flag, tps in (("--decode-tps", decode_tps), ("--train-tps", train_tps)):
        if tps is not None and not (math.isfinite(tps) and tps > 0):
            raise ConfigError(f"{flag} {tps}: tokens per second must be a positive finite number (as measured on the "
                              "GPU), or leave both out to measure them")
    if (decode_tps is None) != (train_tps is None):
        raise ConfigError("give both --decode-tps and --train-tps to estimate with, or neither to measure them")


def preflight(cfg: Config, decode_tps: float | None, train_tps: float | None, measure: bool, gpus: int = 1) -> int:
    """Print the pre-flight report for `gpus` GPUs (with the throughputs given, `check_throughputs`, else measured);
    1 when a required check fails."""
    from tg.gpu.preflight import Throughput, format_report, run_preflight
    check_throughputs(decode_tps, train_tps)
    given = Throughput(decode_tps, train_tps, "given") if decode_tps and train_tps else None
    checks = run_preflight(cfg, given, measure=measure, gpus=gpus)
    print(format_report(checks))
    return 1 if any(c.failed for c in checks) else 0


def doctor() -> int:
    """Print installed versions against the tested matrix; 1 on a mismatch or a missing dependency."""
    from tg.gpu.doctor import compare, failed, format_rows, installed_versions, read_matrix
    rows = compare(installed_versions(), read_matrix(resolve(".")))
    print(format_rows(rows))
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"torch CUDA: {torch.version.cuda or 'cpu build'}, device: {cuda}")
    return 1 if failed(rows) else 0


def data_corpus(out: str, source: str, index: bool) -> None:
    """wiki-18 as JSONL; with `index`, build the BM25 index and report build time, peak RAM and disk size."""
    import resource
    from tg.agent.data import prepare_corpus
    from tg.agent.retrieval import bm25_for
    corpus = prepare_corpus(out, source)
    print(f"corpus: {corpus} ({corpus.stat().st_size / 2**30:.2f} GiB)")
    if index:
        t0 = time.perf_counter()
        retriever = bm25_for(corpus)
        size = sum(f.stat().st_size for f in (corpus.parent / "bm25").iterdir())
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB
        print(f"BM25 index: {corpus.parent / 'bm25'}, {len(retriever.docs):,} passages, "
              f"{time.perf_counter() - t0:.0f} s, peak RSS {rss:.2f} GiB, {size / 2**30:.2f} GiB on disk")


def data_prepare(setting: str, out: str, source: str) -> None:
    from tg.agent.data import prepare
    paths = prepare(setting, out, source=source)
    print({k: str(v) for k, v in paths.items()})


def retriever_serve(corpus: str, host: str, port: int, allow_remote: bool = False) -> None:
    """Load (or build) the corpus's BM25 index, bind the port, then say where it serves."""
    from tg.agent.retrieval import bm25_for
    from tg.agent.server import serve
    retriever = bm25_for(corpus)
    serve(retriever, host=host, port=port, allow_remote=allow_remote,
          ready=lambda line: print(f"{corpus}: {len(retriever.docs):,} documents; {line}", flush=True))


def demo(cfg: Config, root: str | None = None) -> None:
    """`make demo`: rows, figure and runs under `root` (default runs/demo/, tg.experiments.demo.outputs)."""
    from tg.experiments.demo import run_demo
    run_demo(cfg, root)
