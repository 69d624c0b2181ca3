"""Config: presets, the one switch, validation messages that name the field, round trips."""

import json

import pytest

from tg.cli import method_config
from tg.config import PRESETS, Config, ConfigError, load_config


def test_default_preset_is_cpu_and_env_switch(monkeypatch):
    monkeypatch.delenv("TG_PRESET", raising=False)
    assert load_config().preset == "cpu"
    monkeypatch.setenv("TG_PRESET", "paper-1.5b-multi-hop")
    cfg = load_config()
    assert cfg.preset == "paper-1.5b-multi-hop" and cfg.model.name_or_path == "Qwen/Qwen2.5-1.5B"
    assert load_config("cpu").preset == "cpu"  # an explicit argument wins over the environment


def test_unknown_preset_lists_the_valid_names(monkeypatch):
    monkeypatch.setenv("TG_PRESET", "gpu-huge")
    with pytest.raises(ConfigError) as err:
        load_config()
    assert "gpu-huge" in str(err.value) and all(name in str(err.value) for name in PRESETS)


@pytest.mark.parametrize("override, field", [
    ("tree.M=0", "tree.M"), ("tree.N=-1", "tree.N"), ("tree.N=2", "tree.N/tree.L"),
    ("data.top_k=0", "data.top_k"), ("agent.top_p=0", "agent.top_p"), ("optim.loss_agg=sum", "optim.loss_agg"),
    ("model.finetune=adapter", "model.finetune"), ("optim.mini_batch_prompts=5", "optim.mini_batch_prompts"),
    ("optim.advantage=both", "optim.advantage"), ("warmup.multi_hop_share=1.5", "warmup.multi_hop_share"),
])
def test_invalid_values_name_the_field_and_the_range(override, field):
    base = load_config("cpu", "tree.N=0", "tree.L=0") if override == "tree.N=2" else load_config("cpu")
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("/", "/")) as err:
        base.with_overrides(override)
    assert "allowed" in str(err.value)


def test_unknown_override_field_is_rejected():
    with pytest.raises(ConfigError, match="not 'group.field=value'"):
        load_config("cpu", "tree.K=3")


@pytest.mark.parametrize("override, meant", [("optim.lrr=1", "optim.lr"), ("optm.lr=1", "optim.lr"),
                                             ("tree.node_rul=entropy", "tree.node_rule")])
def test_a_mistyped_field_is_named_with_the_closest_one(override, meant):
    with pytest.raises(ConfigError) as err:
        load_config("cpu", override)
    assert f"override {override!r} is not 'group.field=value' with a known field (did you mean `{meant}`?)" in str(
        err.value)
    with pytest.raises(ConfigError, match=r"known field; see"):                    # nothing close: no guess
        load_config("cpu", "zzz.qqq=1")


def test_a_misspelt_lora_target_is_one_line_naming_the_closest_layer(warm_policy_dir):
    """Before peft would fail on it with a traceback: the targets are checked against the model's linear layers."""
    from tg.agent.finetune import trainable_policy
    cfg = load_config("cpu", "model.finetune=lora", "model.lora_targets=q_proj,v_prj").model
    with pytest.raises(ConfigError) as err:
        trainable_policy(warm_policy_dir, cfg)
    message = str(err.value)
    assert message.startswith("config field `model.lora_targets` names 'v_prj', no linear layer of the model "
                              "(did you mean `v_proj`?); its linear layers: ") and "\n" not in message


def test_paper_presets_follow_the_paper_where_one_gpu_allows():
    for name in ("paper-1.5b-single-hop", "paper-1.5b-multi-hop"):
        c = load_config(name)
        assert (c.tree.M, c.tree.N, c.tree.L) == (2, 2, 1) and c.agent.max_turns == 3 and c.data.top_k == 3
        assert c.optim.steps == 180 and c.optim.prompts_per_step == 512 and c.optim.mini_batch_prompts == 64
        assert c.optim.kl_beta == 0.001 and c.agent.format_penalty == 0.2 and c.model.finetune == "qlora"
    assert load_config("paper-1.5b-single-hop").data.setting == "single-hop"


def test_tree_counts_and_budget_properties():
    t = load_config("cpu").tree
    assert (t.leaves_per_tree, t.group_size, t.chain_equivalent_budget) == (3, 6, 4.0)
    chain = method_config(load_config("cpu"), "chain", group_size=8).tree
    assert (chain.M, chain.N, chain.L, chain.is_chain, chain.group_size) == (8, 0, 0, True, 8)


def test_save_load_round_trip_and_hash(tmp_path):
    cfg = load_config("cpu", "tree.M=3", "optim.lr=0.0003", "model.lora_targets=q_proj,v_proj")
    path = cfg.save(tmp_path)
    back = Config.from_dict(json.loads(path.read_text()))
    assert back == cfg and back.hash() == cfg.hash() and back.model.lora_targets == ("q_proj", "v_proj")
    assert cfg.hash() != load_config("cpu").hash()
    assert cfg.hash("data") == load_config("cpu").hash("data")


def test_config_prints_as_a_table():
    text = str(load_config("cpu"))
    assert text.splitlines()[0].startswith("preset: cpu") and "[tree]" in text and "node_rule" in text


def test_eval_points_every_k_steps_and_at_the_end():
    from tg.config import OptimConfig
    assert OptimConfig(steps=180, eval_every=60).eval_points() == [60, 120, 180]
    assert OptimConfig(steps=50, eval_every=20).eval_points() == [20, 40, 50]
    assert OptimConfig(steps=60).eval_points() == [60]
    with pytest.raises(ConfigError, match="optim.eval_every"):
        load_config("cpu", "optim.eval_every=-1")


def test_an_added_field_at_its_default_keeps_every_committed_hash():
    """`optim.pack_trees` came after the first committed rows: at its ADDED_FIELDS value (False) it leaves their
    config hashes alone; set (the cpu preset's default), it keys a different run. results/demo.csv holds `make
    demo` rows of both kinds, for the same two shapes."""
    import csv

    from tg.agent.world import REPO_ROOT
    hashes = {r["config_hash"] for r in csv.DictReader((REPO_ROOT / "results" / "demo.csv").open())}
    for shape in (dict(M=4, N=0, L=0), dict(M=2, N=2, L=1)):
        c = load_config("cpu").replace(tree=shape)
        unpacked = c.replace(optim=dict(pack_trees=False))
        assert c.optim.pack_trees and unpacked.hash() != c.hash()
        assert {unpacked.hash(), c.hash()} <= hashes


@pytest.mark.parametrize("override, shown, allowed", [
    ("optim.lr=abc", "'abc'", "a finite number"), ("tree.M=four", "'four'", "an integer"),
    ("optim.steps=1.5", "1.5", "an integer"), ("tree.M=2.7", "2.7", "an integer"),
    ("data.top_k=true", "True", "an integer"), ("optim.lr=Infinity", "inf", "a finite number"),
    ("warmup.enabled=yes", "'yes'", "true or false"), ("optim.lr=[1]", "[1]", "a finite number"),
])
def test_a_value_of_the_wrong_type_names_field_value_and_type(override, shown, allowed):
    field = override.split("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config("cpu", override)
    assert str(err.value) == f"config field `{field}` = {shown} is invalid: allowed {allowed}"


def test_values_are_read_by_their_fields_type():
    c = load_config("cpu", "optim.lr=1", "model.name_or_path=123", 'data.data_dir="d"', "warmup.enabled=false")
    assert c.optim.lr == 1 and c.model.name_or_path == "123" and c.data.data_dir == "d" and c.warmup.enabled is False
    assert c.hash() == load_config("cpu", "optim.lr=1", "model.name_or_path=123", "data.data_dir=d",
                                   "warmup.enabled=false").hash()
    for bad in ("hash.x=1", "preset.upper=1", "tree.__class__=1", "optim=1", "optim.lr"):
        with pytest.raises(ConfigError, match="not 'group.field=value'"):
            load_config("cpu", bad)


def test_a_saved_config_is_checked_as_strictly(tmp_path):
    d = load_config("cpu").to_dict()
    d["tree"]["M"] = "2"
    with pytest.raises(ConfigError, match=r"`tree\.M` = '2' is invalid: allowed an integer"):
        Config.from_dict(d)
    d["tree"] = {"M": 2, "K": 1}
    with pytest.raises(ConfigError, match="unknown field.*K.*tree"):
        Config.from_dict(d)


@pytest.mark.parametrize("override, field", [
    ("optim.seed=-1", "optim.seed"), ("optim.adv_eps=0", "optim.adv_eps"), ("optim.weight_decay=-0.1",
    "optim.weight_decay"), ("data.retriever_url=localhost:8000", "data.retriever_url"), ("model.lora_targets=[]",
    "model.lora_targets"), ("model.name_or_path=", "model.name_or_path"), ("warmup.seed=-2", "warmup.seed"),
])
def test_fields_that_had_no_range_check_have_one(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config("cpu", override)
