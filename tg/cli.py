"""The `tg` command line. Every command prints its config first and saves it beside its results.

    tg config   [--preset P] [--set group.field=value ...]
    tg world    [--preset P]                     build the synthetic world, show a document and questions
    tg warmup   [--preset P] [--rebuild [DIR]]   report the starting policy's EMs (--rebuild: train it anew)
    tg train    --method chain|tree [--M --N --L | --group-size G] [--steps --seed --resume --run-dir]
                [--schedule paper|quick] [--recipe full] [--skip-preflight] [--report-to tensorboard]
                (on K GPUs: torchrun --nproc_per_node K -m tg train ..., docs/distributed.md)
    tg preflight [--preset P] [--method ...] [--schedule S] [--gpus K] [--decode-tps X --train-tps Y] [--no-measure]
    tg plan                                      which Table 1 models fit on 1-8 GPUs, estimated cost
    tg doctor                                    installed versions against the tested matrix
    tg eval     --policy RUN_DIR|PATH [--out results/eval.csv]   a checkpoint: under the config it was trained with
    tg demo     [--root DIR]                     chain GRPO vs Tree-GRPO from the same warmed-up policy (runs/demo/)
    tg data prepare --setting single-hop|multi-hop --out DIR [--source HUB_ID|LOCAL_DIR]
    tg data corpus  --out DIR [--source HUB_ID|wiki-18.jsonl.gz] [--index]   wiki-18 (+ its BM25 index)
    tg retriever serve --corpus corpus.jsonl [--port 8000] [--host H --allow-remote]
    tg mini     list | run EXPERIMENT|all [--workers 2] [--root DIR] | report [EXPERIMENT] [--readme]
                | rerun GRID CELL SEED [--steps K] | compare GRID --root DIR | compare CSV
                the claims in miniature (results/mini/; --root DIR: DIR/results/mini/)

`python -m tg ...` is the same command. A mistake in the input (a config value, a data file, a policy path,
an unreachable retriever, a diverged run) ends in one line that says what to fix (`USER_ERRORS`), and so does
Ctrl-C (with what continues the command); `--debug`, before or after the command name, shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from tg.config import Config, ConfigError, load_config


def _config(args: argparse.Namespace) -> Config:
    """The command's config: the preset, schedule and recipe, then --set, then what --method, --steps and --seed
    say (a count given is used as given: a zero or negative one is refused by the config's checks, never
    replaced by a default), validated once, after all of them. `tg eval --policy RUN_DIR|CHECKPOINT` starts
    instead from the config the checkpoint was trained with."""
    given = method_overrides(args.method, args.M, args.N, args.L, args.group_size) if getattr(args, "method", None) \
        else []
    given += [f"optim.{k}={getattr(args, k)}" for k in ("steps", "seed") if getattr(args, k, None) is not None]
    saved = _eval_run_config(args) if args.command == "eval" else None
    cfg = saved.with_overrides(*args.set) if saved else load_config(args.preset, *args.set, *given,
                                                                    schedule=args.schedule, recipe=args.recipe)
    if args.command == "train":
        from tg.gpu.distributed import with_shards, world_size
        cfg = with_shards(cfg, world_size())  # under torchrun: one rollout shard per rank unless set
    return cfg


def _eval_run_config(args: argparse.Namespace) -> Config | None:
    """The config the checkpoint `tg eval --policy` names was trained with (`tg.store.rundir.trained_config`; None for
    a model or hub id): the run is evaluated as it was trained (its task, reward, fine-tuning and preset), changed
    only by --set, wherever the checkpoint lies."""
    from tg.pipeline import policy_source
    from tg.store.rundir import trained_config
    checkpoint = policy_source(args.policy)[1] if args.policy else None
    saved = trained_config(checkpoint) if checkpoint is not None else None
    chosen = [f"--{k}" for k in ("preset", "schedule", "recipe") if getattr(args, k) is not None]
    if saved is not None and chosen:
        raise ConfigError(f"tg eval --policy {args.policy} evaluates the checkpoint under the config it was trained "
                          f"with (preset {saved.preset}): drop {', '.join(chosen)}, and change single fields with --set")
    return saved


def method_overrides(method: str, M: int | None = None, N: int | None = None, L: int | None = None,
                     group_size: int | None = None) -> list[str]:
    """The tree shape a method names, as overrides: 'chain' with group size G (default 4) is the tree (G, 0, 0);
    'tree' sets those of (M, N, L) given and keeps the rest."""
    if method == "chain":
        return [f"tree.M={4 if group_size is None else group_size}", "tree.N=0", "tree.L=0"]
    return [f"tree.{k}={v}" for k, v in (("M", M), ("N", N), ("L", L)) if v is not None]


def method_config(cfg: Config, method: str, M: int | None = None, N: int | None = None, L: int | None = None,
                  group_size: int | None = None) -> Config:
    """`cfg` with the tree shape of `method_overrides`."""
    return cfg.with_overrides(*method_overrides(method, M, N, L, group_size))


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help="cpu (default), smol (SmolLM2-135M on CPU) or "
                                                  "paper-{1.5b,3b,llama-3b,7b,14b}-{single,multi}-hop; else $TG_PRESET")
    p.add_argument("--set", action="append", default=[], metavar="GROUP.FIELD=VALUE", help="override a field")
    p.add_argument("--schedule", choices=("paper", "quick"), default=None,
                   help="paper: 180 steps x 512 prompts; quick: 60 x 64 (tg.config.SCHEDULES); default: the preset's")
    p.add_argument("--recipe", choices=("full", "qlora"), default=None,
                   help="full: the paper's full fine-tuning (bf16, lr 1e-6; FSDP2 over several GPUs); default: the "
                        "preset's (tg.config.RECIPES)")


def _add_method(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--method", choices=("chain", "tree"), required=required)
    p.add_argument("--M", type=int)
    p.add_argument("--N", type=int)
    p.add_argument("--L", type=int)
    p.add_argument("--group-size", type=int, help="chain GRPO group size G (default 4)")
    p.add_argument("--steps", type=int)


USER_ERRORS = ("tg.config_values:ConfigError", "tg.agent.data:DataError", "tg.agent.server:RetrieverUnavailableError",
               "tg.agent.server:RetrieverResponseError", "tg.agent.server:ServerStartError",
               "tg.trainer:NonFiniteError", "tg.engines.vllm_setup:VLLMSetupError",
               "tg.engines.vllm_engine:PolicySyncError", "tg.gpu.distributed:RankLostError", "tg.agent.env:PluginError",
               "tg.experiments.runner:JobsFailed")
"""Errors whose message names the problem and its fix (PolicyError is a ConfigError): printed as one line."""

COMMANDS = {
    "config": "print the config (the preset with --set overrides) and its hash",
    "world": "build the synthetic world; show a document and three questions",
    "warmup": "report the starting policy's greedy EMs (--rebuild: train it anew)",
    "demo": "chain GRPO vs Tree-GRPO from the same warmed-up policy",
}
"""The subcommands that take only the common options, and what each does."""
DEBUG_HELP = "show an error's traceback instead of its one-line message"


def user_error(err: BaseException) -> bool:
    """Whether `err` is one of `USER_ERRORS` (looked up among the modules already imported: the error of a
    module never imported cannot have been raised)."""
    for name in USER_ERRORS:
        module, cls = name.split(":")
        if module in sys.modules and isinstance(err, getattr(sys.modules[module], cls)):
            return True
    return False


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tg", description="Tree-GRPO kit (arXiv 2509.21240)")
    ap.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, what in COMMANDS.items():
        _add_common(sub.add_parser(name, help=what))
    sub.choices["warmup"].add_argument(
        "--rebuild", nargs="?", const="", default=None, metavar="DIR",
        help="train the warm-up anew (about 10 min) into DIR (default: the cache, where runs of this config find it) "
             "instead of loading the pinned policy")
    sub.choices["demo"].add_argument(
        "--root", default=None, metavar="DIR",
        help="write DIR/results/demo.csv, DIR/figures/demo_chain_vs_tree.png and DIR/runs/ (default runs/demo, "
             "ignored by git; --root . appends to the committed reference rows the README's table shows)")
    t = sub.add_parser("train", help="train chain GRPO or Tree-GRPO, evaluate, append rows to results/runs.csv")
    _add_common(t)
    _add_method(t, required=True)
    t.add_argument("--seed", type=int)
    again = t.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint.pt")
    again.add_argument("--overwrite", action="store_true", help="replace the run already in RUN_DIR (its checkpoints "
                                                                 "and metrics) instead of refusing")
    t.add_argument("--run-dir", default=None, help="default runs/<method>-<config hash>")
    t.add_argument("--skip-preflight", action="store_true", help="do not run `tg preflight`'s checks first")
    t.add_argument("--report-to", choices=("none", "tensorboard"), default="none",
                   help="also write the metrics to RUN_DIR/tensorboard (TRL's convention)")
    f = sub.add_parser("preflight", help="check CUDA, memory, model, data, retriever; estimate the wall time")
    _add_common(f)
    _add_method(f, required=False)
    f.add_argument("--decode-tps", type=float, help="sampled tokens/s to estimate with (instead of measuring)")
    f.add_argument("--train-tps", type=float, help="trained tokens/s (forward + backward) to estimate with")
    f.add_argument("--no-measure", action="store_true", help="do not load the model to measure tokens/s")
    f.add_argument("--gpus", type=int, default=1, help="estimate memory per rank and wall time for K GPUs")
    sub.add_parser("plan", help="which Table 1 models fit on 1-8 GPUs of 24/48/80 GB; estimated cost (tg.gpu.plan)")
    sub.add_parser("doctor", help="installed versions against the tested matrix")
    e = sub.add_parser("eval", help="greedy EM of a run's checkpoint or a model on the test sets")
    _add_common(e)
    e.add_argument("--policy", default=None, help="a run directory (its checkpoint.pt), a checkpoint file, a model "
                                                  "directory or a hub id; default: the preset's starting policy")
    e.add_argument("--out", default="results/eval.csv")
    leaves = _add_data_and_retriever(sub)
    _add_mini(sub)
    for p in [*sub.choices.values(), *leaves]:  # --debug also after the command name
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return ap


def _add_data_and_retriever(sub: Any) -> list[argparse.ArgumentParser]:
    """`tg data prepare|corpus` and `tg retriever serve`; returns those three parsers."""
    data = sub.add_parser("data", help="prepare NQ/HotpotQA question files or the wiki-18 corpus").add_subparsers(
        dest="action", required=True)
    d = data.add_parser("prepare", help="FlashRAG datasets -> Search-R1 train/test parquet files")
    d.add_argument("--setting", choices=("single-hop", "multi-hop"), required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--source", default="RUC-NLPIR/FlashRAG_datasets", help="hub id or a local FlashRAG directory")
    c = data.add_parser("corpus", help="the wiki-18 corpus as JSONL (Search-R1's), optionally its BM25 index")
    c.add_argument("--out", required=True)
    c.add_argument("--source", default="PeterJinGo/wiki-18-corpus", help="hub dataset id or a local .jsonl(.gz)")
    c.add_argument("--index", action="store_true", help="also build the BM25 index; report time, peak RAM, disk")
    r = sub.add_parser("retriever", help="serve BM25 over a corpus as a Search-R1 /retrieve server").add_subparsers(
        dest="action", required=True).add_parser("serve", help="serve until Ctrl-C")
    r.add_argument("--corpus", required=True, help="JSONL with id and contents (wiki-18 layout)")
    r.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only; "
                                                       "another, e.g. 0.0.0.0, needs --allow-remote)")
    r.add_argument("--port", type=int, default=8000)
    r.add_argument("--allow-remote", action="store_true",
                   help="listen on a non-loopback --host; the server has no authentication")
    return [d, c, r]


def _add_mini(sub: Any) -> None:
    m = sub.add_parser("mini", help="the paper's claims in miniature: named grids -> results/mini/<name>.csv")
    m.add_argument("action", choices=("list", "run", "report", "rerun", "compare"))
    m.add_argument("experiment", nargs="?", help="budget, ledger, theory, shapes, ablation, sweep, branching "
                                                 "(see `tg mini list`; run: also all, every grid in turn); rerun, "
                                                 "compare: a grid name or its CSV")
    m.add_argument("cell_seed", nargs="*", metavar="CELL SEED",
                   help="rerun: the cell and seed of a committed training row, e.g. multi-hop/hard/tree 0")
    m.add_argument("--steps", type=int, metavar="K", help="rerun: only the first K training steps")
    m.add_argument("--workers", type=int, default=2, help="processes, one torch thread each (default 2 = 2 cores)")
    m.add_argument("--until", type=int, metavar="STEP",
                   help="run: only the evaluation points up to STEP now, e.g. every run to step 60 before any goes on "
                        "to 120; a later run without it resumes each run from its checkpoint (default: all points)")
    m.add_argument("--cell", action="append", metavar="NAME",
                   help="run only this cell (repeatable): a name or its last parts, e.g. --cell 'tree (1,2,1)' (both "
                        "starts) --cell moderate/chain-16 (one); default all")
    m.add_argument("--root", metavar="DIR", help="read and write DIR/results/mini/ (default: this checkout's); "
                                                 "compare: the rerun's root, compared with this checkout's rows")
    m.add_argument("--readme", action="store_true",
                   help="report: also rewrite the generated blocks of README.md and results/mini/README.md")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parser().parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"tg: interrupted{_resume_hint(args)}", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 (only USER_ERRORS are caught; the rest re-raise)
        if args.debug or not user_error(err):
            raise
        print(f"tg: {' '.join(str(err).split())} (--debug shows the traceback)", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


def _resume_hint(args: argparse.Namespace) -> str:
    """What continues an interrupted command, for the one line Ctrl-C prints."""
    if args.command == "train":
        return ("; its last checkpoint is kept: the same command with --resume continues exactly from it "
                "(bitwise equal to an uninterrupted run)")
    if args.command == "mini" and args.action == "run":
        return "; the rows written are kept: the same command goes on from them, each run from its last checkpoint"
    return ""


def _dispatch(args: argparse.Namespace) -> int:
    from tg import commands
    if args.command == "doctor":
        return commands.doctor()
    if args.command == "plan":
        from tg.gpu.plan import report
        print(report())
        return 0
    if args.command == "data" and args.action == "corpus":
        commands.data_corpus(args.out, args.source, args.index)
        return 0
    if args.command == "data":
        commands.data_prepare(args.setting, args.out, args.source)
        return 0
    if args.command == "retriever":
        commands.retriever_serve(args.corpus, args.host, args.port, args.allow_remote)
        return 0
    if args.command == "mini" and args.action == "rerun":
        from tg.experiments import rerun
        if len(args.cell_seed) != 2 or not args.cell_seed[1].isdigit():
            raise ConfigError("tg mini rerun needs GRID CELL SEED, e.g. tg mini rerun budget multi-hop/hard/tree 0")
        path = rerun.grid_csv(args.experiment or "", args.root)
        return 0 if rerun.rerun(path, args.cell_seed[0], int(args.cell_seed[1]), steps=args.steps).equal else 1
    if args.command == "mini" and args.action == "compare":
        from tg.experiments import rerun
        if not args.experiment:
            raise ConfigError("tg mini compare needs the rerun grid: GRID --root DIR (where `tg mini run GRID --root "
                              "DIR` wrote) or its CSV")
        found = rerun.compare_grid(args.experiment, args.root)
        print("\n".join(rerun.describe_comparison(c) for c in found))
        return 0 if all(c.identical == c.matched for c in found) else 1
    if args.command == "mini":
        from tg.experiments import claims, mini, report, runner
        if args.action == "run":
            runner.check_workers(args.workers)  # bad input first, before the grid's listing
            runner.check_until(args.until)
        print(mini.describe(args.experiment), flush=True)
        if args.action == "run":
            if not args.experiment:
                raise ConfigError("tg mini run needs an EXPERIMENT name (or all); see `tg mini list`")
            if args.experiment == "all" and args.cell:
                raise ConfigError("tg mini run all runs every cell of every grid: name one grid with --cell")
            for name in mini.experiments() if args.experiment == "all" else [args.experiment]:
                cells = mini.select_cells(name, args.cell)
                runner.run_experiment(name, workers=args.workers, root=args.root, cells=cells, until=args.until)
        if args.action == "report" and args.readme:
            for path in report.write_readmes(args.root):
                print(f"rewrote the generated block of {path}")
            print(f"\n{claims.claims_report(args.root)}")
        elif args.action == "report" and args.experiment:
            print(f"\n## {args.experiment}\n\n{report.grid_report(args.experiment, args.root)}")
        elif args.action == "report":
            print(f"\n{report.full_report(args.root)}")
        return 0
    if args.command == "preflight":
        from tg.gpu.preflight import check_gpus
        check_gpus(args.gpus)  # bad input first, before the config is printed
        commands.check_throughputs(args.decode_tps, args.train_tps)
    cfg = _config(args)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 prints
        print(cfg, flush=True)
    if args.command == "config":
        return 0
    if args.command == "warmup":
        commands.warmup(cfg, None if args.rebuild is None else Path(args.rebuild) if args.rebuild else True)
        return 0
    if args.command == "world":
        commands.world(cfg)
    elif args.command == "demo":
        commands.demo(cfg, args.root)
    elif args.command == "preflight":
        return commands.preflight(cfg, args.decode_tps, args.train_tps, measure=not args.no_measure, gpus=args.gpus)
    elif args.command == "train":
        row = commands.train(cfg, Path(args.run_dir) if args.run_dir else None, args.resume,
                             preflight=not args.skip_preflight, overwrite=args.overwrite, report_to=args.report_to)
        return 0 if row is not None else 1
    elif args.command == "eval":
        commands.evaluate_policy(cfg, args.policy, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
