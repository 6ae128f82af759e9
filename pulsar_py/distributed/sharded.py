"""``ShardedRenderer``: one scene's spheres split across the ranks of a process group."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import ops
from ..cameras import Camera
from ..renderer import Renderer
from .agreement import check_ranks_agree
from .merge import merge_depth_statistics, merge_forward_info, merge_partial_states, share_offset

Tensor = torch.Tensor

# The settings every rank's call must share (fields of ops.RenderSettings' parts).
_AGREED = (
    "width",
    "height",
    "n_track",
    "orthographic",
    "background_normalized_depth",
    "gamma",
    "percent_allowed_difference",
    "max_n_hits",
    "right_handed",
    "want_forward_info",
    "want_depth_moments",
    "batch_dim",
    "camera_length",
    "first_R_then_T",
    "min_depth",
    "max_depth",
)


class ShardedRenderer(Renderer):
    """A Renderer whose scene is split across the ranks of a torch.distributed group.

    Each rank passes its own share of the spheres (any count, zero included) and the same
    cameras and settings as every other rank; every rank gets the image of all spheres.
    Each share renders to a partial per-pixel state, and the states merge exactly (the
    blend is a weighted average, independent of the spheres' order; docs/model.md section
    5, "Shares"): two collectives per call, a maximum over [B, H, W] and a sum over
    [B, H, W, C + 1], whatever the number of spheres. In the backward each rank
    differentiates its own spheres against the merged state, and the camera gradient is
    summed over the ranks (one more collective); the background's gradient is computed
    whole on every rank.

    Args:
        *args, **kwargs: as ``Renderer`` (``gradient_scaling`` must be "exact").
        process_group: the group whose ranks share the scene (None: the default group).
            NCCL (CUDA tensors, each rank on its own GPU) or gloo (CPU).

    Rules every rank follows in a call: the same cameras, settings and sphere batch shape
    (the sphere count may differ), and the same ``requires_grad`` of the cameras and the
    background; then every rank computes its loss from the image (the same loss on every
    rank) and calls backward, since the backward holds a collective. With the value checks
    on (``check_values``, the default; the same on every rank) each call first checks that
    the ranks agree (one small all-reduce, read on the host) and raises ValueError on every
    rank when they do not. The collectives run in the caller's CUDA stream order; without
    the value checks a call synchronises with the host only once, as the Renderer does.

    Exactness: with ``percent_allowed_difference = 0`` and no ``max_n_hits`` the image,
    forward info and gradients equal a single-process render of all spheres up to
    rounding. With early termination (p > 0) each share stops on its own normaliser, which
    is never larger than the whole pixel's: it processes every hit of its spheres that a
    single-process render would, and possibly more (the same holds per share under
    ``max_n_hits``). docs/distributed.md gives the resulting bound on the image.

    Supported calls: ``forward`` (mode 0 with or without forward info, whose ids are
    global: the shares numbered in rank order; mode 1, the hit counts summed over the
    ranks), ``render`` (image, depth, coverage, distortion and z_depth of all spheres:
    the shares' depth statistics merge like partial variances, one collective more when
    they are asked for; its hit_count is this rank's share's) and ``visible`` (of this
    rank's spheres). The call runs eagerly (torch.compile leaves it out of its graphs).
    """

    def __init__(self, *args: Any, process_group: Optional[dist.ProcessGroup] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process_group = process_group
        self._check_gradient_scaling()

    def _check_gradient_scaling(self) -> None:
        if self._pulsar_gradients:
            raise ValueError(
                'ShardedRenderer: gradient_scaling: expected "exact" (Pulsar\'s gradient scale is '
                'per sphere over the pixels of one process), got "pulsar"'
            )

    def forward(
        self,
        vert_pos: Tensor,
        vert_col: Tensor,
        vert_rad: Tensor,
        cam_params: Union[Tensor, Camera],
        gamma: float,
        max_depth: float,
        min_depth: float = 0.0,
        bg_col: Optional[Tensor] = None,
        opacity: Optional[Tensor] = None,
        percent_allowed_difference: float = 0.01,
        max_n_hits: Optional[int] = None,
        mode: int = 0,
        return_forward_info: bool = False,
        first_R_then_T: bool = False,
    ) -> Union[Tensor, Tuple[Tensor, Optional[Tensor]]]:
        """``Renderer.forward`` over this rank's spheres: the image of every rank's spheres.

        Args and returns as ``Renderer.forward``; vert_pos [B?, N_r, 3], vert_col
        [B?, N_r, C], vert_rad and opacity [B?, N_r] are this rank's share (N_r >= 0).
        Forward info holds global sphere ids (shares numbered in rank order); mode 1 gives
        the hit counts summed over the ranks.
        """
        out = super().forward(
            vert_pos,
            vert_col,
            vert_rad,
            cam_params,
            gamma,
            max_depth,
            min_depth,
            bg_col,
            opacity,
            percent_allowed_difference,
            max_n_hits,
            mode,
            return_forward_info,
            first_R_then_T,
        )
        if mode == 1:
            hits = out[0] if isinstance(out, tuple) else out
            dist.all_reduce(hits, group=self.process_group)
        return out

    def _render(
        self,
        positions,
        features,
        radii,
        opacities,
        background,
        cameras,
        values: Optional[Tensor],
        settings: ops.RenderSettings,
    ) -> Tuple[Tensor, ...]:
        self._check_gradient_scaling()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedRenderer: torch.distributed is not initialised: call torch.distributed.init_process_group first"
            )
        operands = (positions, features, radii, opacities, background, cameras)
        return sharded_render(operands, values, settings, self.process_group)


@torch.compiler.disable
def sharded_render(
    operands: Tuple[Optional[Tensor], ...],
    values: Optional[Tensor],
    settings: ops.RenderSettings,
    group: Optional[dist.ProcessGroup],
) -> Tuple[Optional[Tensor], ...]:
    """The render operator's outputs (ops.render_call) for this rank's share of the spheres:
    (image, merged blend state, this share's counts, merged forward info or None, None).
    ``operands``: the operator's (positions, features, radii, opacities or None, background
    or None, cameras); ``values``: the call's settings given as data (ops.call_values), or
    None."""
    positions, _, _, _, background, cameras = operands
    settings = ops.resolved_settings(settings, values, positions.device, read=True)
    settings = settings._replace(outputs=settings.outputs._replace(partial=True))
    if settings.checks.check_values:
        batch = positions.shape[0] if positions.dim() == 3 else 0
        fields = settings.flat()
        check_ranks_agree(cameras, background, [*(fields[name] for name in _AGREED), batch], group)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands):
        return _ShardedRender.apply(*operands, settings, group)
    return _forward(operands, settings, settings.encode(), group)


def _forward(operands, settings: ops.RenderSettings, encoded: List[float], group):
    """The merged outputs of this share's render; ``encoded``: ``settings.encode()``."""
    positions, features, _, _, background, _ = operands
    partial, state, counts, info, moments = torch.ops.pulsar.render(*operands, None, encoded)
    # The operator returns [0] for the outputs not asked for.
    info = info if settings.outputs.want_forward_info else None
    moments = moments if settings.outputs.want_depth_moments else None
    bg = (
        background
        if background is not None
        else ops.default_background(features.shape[-1], partial.dtype, partial.device)
    )
    bg_exponent = settings.config.background_normalized_depth / settings.blend.gamma  # as the native blend's s_bg
    image, merged = merge_partial_states(partial, state, bg, bg_exponent, group)
    if info is not None:
        info = merge_forward_info(info, merged, share_offset(positions.shape[-2], positions.device, group), group)
    if moments is not None:
        moments = merge_depth_statistics(moments, state, merged, group)
    return image, merged, counts, info, moments


class _ShardedRender(torch.autograd.Function):
    """The sharded render with its exact gradients: this share's, against the merged state.
    The partial render and its backward are the pulsar::render and pulsar::render_backward
    operators; their autograd formula (ops.render_setup_context, ops.backward_arguments,
    ops.input_gradients) is applied to the merged outputs, with the camera gradient summed
    over the ranks."""

    @staticmethod
    def forward(ctx, positions, features, radii, opacities, background, cameras, settings, group):
        operands = (positions, features, radii, opacities, background, cameras)
        encoded = settings.encode()
        outputs = _forward(operands, settings, encoded, group)
        ops.render_setup_context(ctx, (*operands, None, encoded), outputs)
        ctx.group = group
        return outputs

    @staticmethod
    def backward(ctx, grad_image, _state, _counts, _info, grad_moments):
        args = ops.backward_arguments(ctx, grad_image, grad_moments)
        if args is None:
            return (None,) * 8
        grads = list(torch.ops.pulsar.render_backward(*args))
        if args.needs[5]:  # the camera's gradient comes through every share's spheres
            dist.all_reduce(grads[5], group=ctx.group)
        return (*ops.input_gradients(grads, args)[:6], None, None)  # and settings, group
