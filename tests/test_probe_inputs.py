"""The device probes (benchmarks/) refuse input they cannot run before they look for a GPU."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("probe, extra", [("in_model_conv_kernels", []),
                                          ("in_model_op_probe", ["--ops", "mul_", "--out", "unused.jsonl"])])
def test_the_in_model_probes_refuse_a_model_that_is_not_timm(capsys, probe, extra):
    with pytest.raises(SystemExit):
        _load(probe).main(["--model", "resnet50", *extra])
    assert "--model 'resnet50': only timm models are accepted, written timm:NAME" in capsys.readouterr().err


def test_the_suite_comparison_refuses_a_benchmark_the_suite_lacks(capsys):
    with pytest.raises(SystemExit):
        _load("suite_vs_probe_conv").main(["conv2d_bwd_bf16_c384_384_hw14_k1_s1_g24_n128_nhwc", "conv2d_nope"])
    err = capsys.readouterr().err
    assert "not a conv benchmark of the suite: conv2d_nope (accepted:" in err
    assert "conv2d_bwd_bf16_c384_384_hw14_k1_s1_g24_n128_nhwc" not in err.split("suite:")[1].split("(")[0]


def test_the_power_probe_refuses_a_series_it_does_not_have(capsys):
    with pytest.raises(SystemExit):
        _load("power_curve_probe").main(["--out", "unused.jsonl", "--series", "static,bogus"])
    assert "unknown series bogus; accepted: static, gemm, elementwise, sustained" in capsys.readouterr().err


def test_the_kernel_gap_probe_refuses_unknown_configs_and_test_split_models(capsys):
    from gpuest.evaluate.validation_set import TEST_MODELS, get_set
    test_key = next(c.key for c in get_set("generalisation") if c.model in TEST_MODELS)
    with pytest.raises(SystemExit):
        _load("kernel_gap_probe").main(["--out", "unused.jsonl", "--series", "networks",
                                        "--keys", f"resnet50|b999|i224|inference|fp32;{test_key}"])
    err = capsys.readouterr().err
    assert "unknown config resnet50|b999|i224|inference|fp32" in err
    assert f"{test_key}: in a frozen test split" in err
    with pytest.raises(SystemExit):
        _load("kernel_gap_probe").main(["--out", "unused.jsonl", "--series", "ops,bogus"])
    assert "unknown series bogus; accepted: ops, networks" in capsys.readouterr().err
