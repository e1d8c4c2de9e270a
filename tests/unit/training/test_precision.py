"""Mixed-precision selection and the per-rank step-time summary."""

import pytest
import torch

from retrieval.errors import ConfigError
from training.config import TrainConfig
from training.precision import resolve_precision
from training.stragglers import summarise_spread

CPU = torch.device("cpu")


def test_auto_is_fp32_on_cpu_and_bf16_can_be_forced():
    auto = resolve_precision("auto", CPU)
    assert (auto.name, auto.scaler) == ("fp32", None)
    layer = torch.nn.Linear(8, 8)
    with auto.autocast():
        assert layer(torch.ones(2, 8)).dtype == torch.float32
    forced = resolve_precision("bf16", CPU)
    with forced.autocast():
        assert layer(torch.ones(2, 8)).dtype == torch.bfloat16
    assert resolve_precision("off", CPU).name == "fp32"


def test_fp16_on_cpu_and_unknown_modes_are_config_errors():
    with pytest.raises(ConfigError) as error:
        resolve_precision("fp16", CPU)
    assert error.value.field == "amp" and "CUDA" in str(error.value)
    with pytest.raises(ConfigError):
        resolve_precision("int4", CPU)
    with pytest.raises(ConfigError) as error:
        TrainConfig(root="r", collection="c", amp="fp8").validate()
    assert error.value.field == "amp"


def test_spread_summary_names_the_slow_rank():
    steps = [[9.0, 9.0]] * 2 + [[1.0, 2.0], [1.0, 2.2], [1.2, 2.0], [1.0, 2.1]]  # two warm-up steps skipped
    spread = summarise_spread(steps, straggler_events=3)
    assert spread["steps"] == 4
    assert spread["median_s"] == [1.0, 2.05]
    assert spread["slowest_over_fastest"] == 2.05
    assert spread["median_step_spread"] == pytest.approx(2.05)  # 2.0, 2.2, 1.67, 2.1
    assert spread["straggler_events"] == 3
    assert summarise_spread([]) == {}
