"""Measure `tg.agent.retrieval.BM25Retriever` on a wiki-like synthetic corpus: build time, peak RAM, index size,
load time and query latency, and extrapolate to wiki-18 (21,015,324 passages of ~100 words).

    .venv/bin/python bench/bm25_build.py --docs 100000 --words 100

The corpus is random text over a Zipf-distributed vocabulary of pronounceable pseudo-words
(wiki-18 passages are 100-word chunks; their vocabulary is a few million types). The build runs in a
fresh child process so that its peak resident memory (ru_maxrss) is the build's alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WIKI18_PASSAGES = 21_015_324


def write_corpus(path: Path, n_docs: int, words: int, vocab: int, seed: int) -> None:
    """n_docs rows {"id", "contents": '"Title"\\ntext'} of `words` Zipf-distributed pseudo-words each."""
    rng = np.random.default_rng(seed)
    syll = np.array([c + v for c in "bdfgklmnprstvz" for v in "aeiou"])
    lexicon = ["".join(rng.choice(syll, size=rng.integers(1, 4))) + str(i % 7) for i in range(vocab)]
    ranks = np.minimum(rng.zipf(1.1, size=n_docs * words), vocab) - 1
    with path.open("w") as f:
        for i in range(n_docs):
            text = " ".join(lexicon[r] for r in ranks[i * words:(i + 1) * words])
            f.write(json.dumps({"id": str(i), "contents": f'"{lexicon[i % vocab]}"\n{text}'}) + "\n")


def child(corpus: Path, index_dir: Path) -> dict:
    """Build, save, load (mmap) and query the index; timings and this process's peak RSS."""
    from tg.agent.retrieval import BM25Retriever

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    retriever = BM25Retriever.build(corpus)
    build_s = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    retriever.save(index_dir)
    del retriever
    t0 = time.perf_counter()
    loaded = BM25Retriever.load(index_dir, mmap=True)
    load_s = time.perf_counter() - t0
    queries = [d["title"] for d in loaded.docs[:200]]
    t0 = time.perf_counter()
    hits = sum(r[0]["title"] == q for q, r in zip(queries, loaded.search(queries, 3)))
    query_ms = (time.perf_counter() - t0) / len(queries) * 1000
    return {"build_s": build_s, "peak_rss_mb": peak_mb, "rss_before_build_mb": rss0 / 1024, "load_s": load_s,
            "query_ms": query_ms, "title_top1": hits / len(queries)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--words", type=int, default=100)
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        corpus, index_dir = Path(tmp) / "corpus.jsonl", Path(tmp) / "bm25"
        t0 = time.perf_counter()
        write_corpus(corpus, args.docs, args.words, args.vocab, args.seed)
        gen_s = time.perf_counter() - t0
        out = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(index_dir)],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        corpus_mb = corpus.stat().st_size / 2**20
        index_mb = sum(f.stat().st_size for f in index_dir.iterdir()) / 2**20
    per_m = 1_000_000 / args.docs
    scale = WIKI18_PASSAGES / args.docs
    print(f"corpus: {args.docs:,} passages x {args.words} words ({corpus_mb:.0f} MB JSONL, generated in {gen_s:.0f} s)")
    print(f"build (read + tokenize + index): {r['build_s']:.1f} s; peak RSS {r['peak_rss_mb']:.0f} MB "
          f"(imports alone {r['rss_before_build_mb']:.0f} MB); saved index + docs {index_mb:.0f} MB")
    print(f"load (mmap): {r['load_s']:.1f} s; query {r['query_ms']:.1f} ms; title top-1 {r['title_top1']:.2f}")
    print(f"per million passages (linear): build {r['build_s'] * per_m / 60:.1f} min, "
          f"RAM {(r['peak_rss_mb'] - r['rss_before_build_mb']) * per_m / 1024:.1f} GB, disk {index_mb * per_m / 1024:.1f} GB")
    print(f"wiki-18 ({WIKI18_PASSAGES:,} passages, linear): build {r['build_s'] * scale / 3600:.1f} h, "
          f"RAM {(r['peak_rss_mb'] - r['rss_before_build_mb']) * scale / 1024:.0f} GB, "
          f"query {r['query_ms'] * scale / 1000:.1f} s")


if __name__ == "__main__":
    main()
