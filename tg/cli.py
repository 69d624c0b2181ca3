"""The `tg` command line. Every command prints its config first and saves it beside its results.

    tg config   [--preset P] [--set group.field=value ...]
    tg world    [--preset P]                     build the synthetic world, show a document and questions
    tg warmup   [--preset P]                     warm up the tiny policy (cached) and report its EMs
    tg train    --method chain|tree [--M --N --L | --group-size G] [--steps --seed --resume --run-dir]
    tg eval     --policy RUN_DIR|PATH [--out results/eval.csv]
    tg demo                                      chain GRPO vs Tree-GRPO from the same warmed-up policy
    tg data prepare --setting single-hop|multi-hop --out DIR [--source HUB_ID|LOCAL_DIR]
    tg retriever serve --corpus corpus.jsonl [--port 8000]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

from tg.config import Config, ConfigError, load_config


def _config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.preset, *args.set)
    if getattr(args, "method", None):
        cfg = method_config(cfg, args.method, args.M, args.N, args.L, args.group_size)
    if getattr(args, "steps", None):
        cfg = cfg.replace(optim=dict(steps=args.steps))
    if getattr(args, "seed", None) is not None:
        cfg = cfg.replace(optim=dict(seed=args.seed))
    return cfg


def method_config(cfg: Config, method: str, M: int | None = None, N: int | None = None, L: int | None = None,
                  group_size: int | None = None) -> Config:
    """'chain' with group size G (default 4) is the tree (G, 0, 0); 'tree' keeps or sets (M, N, L)."""
    if method == "chain":
        return cfg.replace(tree=dict(M=group_size or 4, N=0, L=0))
    t = cfg.tree
    return cfg.replace(tree=dict(M=M or t.M, N=t.N if N is None else N, L=t.L if L is None else L))


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help="cpu (default), paper-1.5b-single-hop, paper-1.5b-multi-hop; "
                                                  "else $TG_PRESET")
    p.add_argument("--set", action="append", default=[], metavar="GROUP.FIELD=VALUE", help="override a field")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tg", description="Tree-GRPO kit (arXiv 2509.21240)")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("config", "world", "warmup", "demo"):
        _add_common(sub.add_parser(name))
    t = sub.add_parser("train")
    _add_common(t)
    t.add_argument("--method", choices=("chain", "tree"), required=True)
    t.add_argument("--M", type=int)
    t.add_argument("--N", type=int)
    t.add_argument("--L", type=int)
    t.add_argument("--group-size", type=int, help="chain GRPO group size G (default 4)")
    t.add_argument("--steps", type=int)
    t.add_argument("--seed", type=int)
    t.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint.pt")
    t.add_argument("--run-dir", default=None, help="default runs/<method>-<config hash>")
    e = sub.add_parser("eval")
    _add_common(e)
    e.add_argument("--policy", default=None, help="a run directory (its checkpoint) or a model path; "
                                                  "default: the preset's starting policy")
    e.add_argument("--out", default="results/eval.csv")
    d = sub.add_parser("data").add_subparsers(dest="action", required=True).add_parser("prepare")
    d.add_argument("--setting", choices=("single-hop", "multi-hop"), required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--source", default="RUC-NLPIR/FlashRAG_datasets", help="hub id or a local FlashRAG directory")
    r = sub.add_parser("retriever").add_subparsers(dest="action", required=True).add_parser("serve")
    r.add_argument("--corpus", required=True, help="JSONL with id and contents (wiki-18 layout)")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=8000)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as err:
        print(f"tg: {err}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    from tg import commands
    if args.command == "data":
        commands.data_prepare(args.setting, args.out, args.source)
        return 0
    if args.command == "retriever":
        commands.retriever_serve(args.corpus, args.host, args.port)
        return 0
    cfg = _config(args)
    print(cfg, flush=True)
    if args.command == "config":
        return 0
    run = {"world": commands.world, "warmup": commands.warmup, "demo": commands.demo}.get(args.command)
    if run:
        run(cfg)
    elif args.command == "train":
        commands.train(cfg, Path(args.run_dir) if args.run_dir else None, args.resume)
    elif args.command == "eval":
        commands.evaluate_policy(cfg, args.policy, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
