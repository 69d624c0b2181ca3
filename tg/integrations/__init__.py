"""Tree-GRPO inside other training engines: verl (`verl.py`) and TRL (`trl.py`), each checked against `tg`."""
