"""Which attention backend runs where, and the errors when one cannot."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernels.attention import check_backend_can_run, create_attention_backend
from kernels.attention.base import AttentionShape
from kernels.cpu.build import find_compiler
from runtime.config import ServerArgs

SHAPE = AttentionShape(num_heads=9, num_kv_heads=3, head_dim=64)


def test_defaults_flashinfer_on_cuda_cpu_or_torch_native_on_cpu(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")  # no compiler: the plain PyTorch path
    assert ServerArgs(device="cpu").resolved_attention_backend == "torch_native"
    assert ServerArgs(device="cpu", attention_backend="cpu").resolved_attention_backend == "cpu"
    monkeypatch.setenv("CXX", "g++")
    if find_compiler() is not None:
        assert ServerArgs(device="cpu").resolved_attention_backend == "cpu"
    assert ServerArgs(device="cuda").resolved_attention_backend == "flashinfer"
    assert ServerArgs(device="cuda:1").resolved_attention_backend == "flashinfer"
    assert ServerArgs(device="cuda", attention_backend="triton").resolved_attention_backend == "triton"


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown"):
        create_attention_backend("flash", "cpu", SHAPE)
    with pytest.raises(ValueError, match="attention_backend must be"):
        ServerArgs(attention_backend="flash")


def test_cpu_backend_runs_on_the_cpu_only():
    with pytest.raises(ValueError, match="CPU only"):
        check_backend_can_run("cpu", "cuda")


def test_flashinfer_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        create_attention_backend("flashinfer", "cpu", SHAPE)


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed here")
def test_flashinfer_not_installed_says_how_to_get_it():
    with pytest.raises(ValueError, match=r"pip install \.\[cuda\]"):
        check_backend_can_run("flashinfer", "cuda")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        create_attention_backend("triton", "cpu", SHAPE)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        check_backend_can_run("triton", "cpu")
    check_backend_can_run("triton", "cuda")  # allowed: the device decides at run time


def test_fast_backends_need_the_attention_shape(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    with pytest.raises(ValueError, match="attention shape"):
        create_attention_backend("triton", "cpu")


def test_engine_refuses_flashinfer_on_cpu(model_dir):
    from runtime.engine import Engine

    with pytest.raises(ValueError, match="flashinfer.*needs a CUDA device"):
        Engine(str(model_dir), device="cpu", attention_backend="flashinfer", max_total_tokens=64)


def test_shape_checks_grouping():
    assert SHAPE.group_size == 3
    with pytest.raises(ValueError, match="multiple"):
        AttentionShape(num_heads=8, num_kv_heads=3, head_dim=64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_engine_on_cuda_without_a_cuda_device_says_so(model_dir):
    from runtime.engine import Engine

    with pytest.raises(ValueError, match="finds no CUDA device"):
        Engine(str(model_dir), device="cuda", max_total_tokens=64)
