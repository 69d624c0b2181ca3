"""Trees per second of verl's tree agent loop with a slow retriever: searches on the event loop vs off it.

`tg.integrations.verl.TreeAgentLoop` runs every environment call on `retrieval_pool` (threads), so one tree's
search does not stall the other trees of its worker. 'blocking' runs the same calls on the event loop itself
(an executor that runs each call where it is submitted), as a synchronous HTTP call inside the agent loop
does. Both grow the same trees: `--trees` sessions (one tree of N = 2, L = 1 each) at once on one event loop, on a
scripted rollout server that answers at once, against the kit's HTTP retriever client and a local `/retrieve`
server that answers each request after `--latency` seconds, requests in parallel. Medians over `--reps`
alternating repetitions (the first dropped). Runs in .venv-verl:

    .venv-verl/bin/python bench/verl_retrieval.py [--trees 32] [--latency 0.05] [--reps 5] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from concurrent.futures import Executor, Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from _blocks import alternating_medians, publish
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

import tg.integrations.verl as V
from tg.agent.policy import build_tokenizer

SCRIPT = ["<search> capital of france </search>", "<search> river of paris </search>", "<answer> paris </answer>"]
"""The policy's steps by the number of observations in its context: two searches, then an answer."""


class SlowHandler(BaseHTTPRequestHandler):
    """A `/retrieve` endpoint that answers every request after `server.latency` seconds, requests in parallel
    (as a Search-R1 retrieval server's thread pool does); the same three documents for every query."""

    def do_POST(self) -> None:
        queries = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["queries"]
        time.sleep(self.server.latency)  # type: ignore[attr-defined]
        doc = {"id": "0", "title": "paris", "contents": "paris is the capital of france"}
        body = json.dumps({"result": [[doc] * 3 for _ in queries]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        """Quiet."""


def slow_server(latency: float) -> ThreadingHTTPServer:
    """A local `SlowHandler` server on a free port, serving from a daemon thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowHandler)
    server.daemon_threads, server.latency = True, latency  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


class ScriptedServer:
    """verl's rollout server stand-in: answers at once, from `SCRIPT`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        turn = min(self.tokenizer.decode(prompt_ids).count("</information>"), len(SCRIPT) - 1)
        return TokenOutput(token_ids=self.tokenizer.encode(SCRIPT[turn], add_special_tokens=False))


class OnTheLoop(Executor):
    """An executor that runs each call where it is submitted: the event loop waits for it, as before."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def grow_trees(config: Any, tokenizer: Any, trees: int) -> None:
    """`trees` sessions of the agent loop at once on one event loop, as verl's worker runs them."""
    async def run() -> None:
        server = ScriptedServer(tokenizer)

        async def one() -> list:
            loop = V.TreeAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                                   processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})))
            return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "capital of france"}])

        outs = await asyncio.gather(*(one() for _ in range(trees)))
        assert all(len(o) == 3 for o in outs)
    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--write", default=None, help="replace the verl_retrieval section of this markdown file")
    args = ap.parse_args()
    tokenizer = build_tokenizer(SCRIPT + ["user assistant paris is the capital of france information doc"])
    server = slow_server(args.latency)
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"name": "vllm", "prompt_length": 256, "response_length": 1024}},
        "algorithm": {"tree_grpo": {"env": "search", "retriever_url": url, "N": 2, "L": 1}}})
    pool = V.retrieval_pool

    def blocking() -> None:
        V.retrieval_pool = OnTheLoop
        try:
            grow_trees(config, tokenizer, args.trees)
        finally:
            V.retrieval_pool = pool

    med = alternating_medians({"blocking": blocking,
                               "off the loop": lambda: grow_trees(config, tokenizer, args.trees)}, args.reps)
    server.shutdown()
    lines = [f"`bench/verl_retrieval.py --trees {args.trees} --latency {args.latency} --reps {args.reps}`: "
             f"{args.trees} trees of 3 leaves at once, retriever latency {args.latency * 1e3:.0f} ms, "
             f"medians of {args.reps - 1} repetitions.", "",
             "| environment calls | s per batch | trees / s | vs blocking |", "|---|---|---|---|"]
    for name, s in med.items():
        lines.append(f"| {name} | {s:.2f} | {args.trees / s:.1f} | {med['blocking'] / s:.1f}x |")
    publish(lines, args.write, "verl_retrieval")


if __name__ == "__main__":
    main()
