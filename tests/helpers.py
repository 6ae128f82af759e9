"""Shared test helpers: devices to run on, random scenes."""

from __future__ import annotations

import torch

import pulsar_py

HAS_CUDA = torch.cuda.is_available() and "cuda" in pulsar_py.build_info()["backends"]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
