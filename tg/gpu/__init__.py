"""Running at the paper's scale: arithmetic before a run, checks, versions, and several ranks.

    estimate.py     memory and wall-time arithmetic of a run (pure)
    preflight.py    the pre-flight checks (`tg preflight`, and before `tg train`)
    plan.py         `tg plan`: the Table 1 presets' memory and time on a given GPU count
    doctor.py       installed versions against the tested matrix (`tg doctor`)
    distributed.py  several ranks under torchrun: prompt shards, DDP, gathered metrics; fsdp.py: FSDP2
"""
