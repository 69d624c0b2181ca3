"""Results and run directories under misuse: concurrent CSV writers, two runs in one directory, a rerun over
a finished run, a resume under another config, a gradient clip that reverses the update."""

import pytest

from tg.config import ConfigError


@pytest.mark.parametrize("value", ["-1", "0", "NaN"])
def test_grad_clip_must_be_positive(cfg, value):
    with pytest.raises(ConfigError, match=r"`optim.grad_clip` = .* allowed > 0") as err:
        cfg.with_overrides(f"optim.grad_clip={value}")
    assert "\n" not in str(err.value)
