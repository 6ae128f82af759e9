"""Loading the golden cases of tests/data/golden (rendered by PyTorch3D's Pulsar)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GOLDEN_DIR = Path(__file__).parent / "data" / "golden"
CASE_NAMES = sorted(p.stem for p in GOLDEN_DIR.glob("*.json"))
UNLIMITED = 4294967295


@dataclass
class GoldenCase:
    name: str
    settings: dict
    arrays: dict

    def tensor(self, key: str, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
        return torch.from_numpy(self.arrays[key]).to(dtype=dtype, device=device)

    def renderer_kwargs(self) -> dict:
        s = self.settings
        return dict(
            width=s["width"],
            height=s["height"],
            orthogonal_projection=s["orthogonal_projection"],
            right_handed_system=s["right_handed_system"],
            background_normalized_depth=s["background_normalized_depth"],
            n_channels=s["n_channels"],
            n_track=s["n_track"],
        )

    def call_args(self, dtype: torch.dtype, device: str = "cpu") -> dict:
        """Arguments of Renderer.forward, camera adjusted for Pulsar's orthographic offset."""
        s = self.settings
        cam = self.tensor("cam_params", dtype, device)
        if s["orthogonal_projection"]:
            # Pulsar draws orthographic pixels half a pixel off (model.md section 8): its
            # image for position pos is ours for pos - 0.5 pdx - 0.5 pdy. With an
            # unrotated camera pdx = (ps, 0, 0), pdy = (0, -ps, 0), ps = sensor / width.
            assert float(cam[3:6].abs().max()) == 0.0, "orthographic golden case with rotation"
            ps = float(cam[7]) / s["width"]
            cam = cam.clone()
            cam[0] -= 0.5 * ps
            cam[1] += 0.5 * ps
        return dict(
            vert_pos=self.tensor("vert_pos", dtype, device),
            vert_col=self.tensor("vert_col", dtype, device),
            vert_rad=self.tensor("vert_rad", dtype, device),
            cam_params=cam,
            gamma=s["gamma"],
            max_depth=s["max_depth"],
            min_depth=s["min_depth"],
            bg_col=self.tensor("bg_col", dtype, device),
            opacity=self.tensor("opacity", dtype, device) if "opacity" in self.arrays else None,
            percent_allowed_difference=s["percent_allowed_difference"],
            max_n_hits=None if s["max_n_hits"] >= UNLIMITED else s["max_n_hits"],
        )


def load_case(name: str) -> GoldenCase:
    settings = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    with np.load(GOLDEN_DIR / f"{name}.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return GoldenCase(name, settings, arrays)
