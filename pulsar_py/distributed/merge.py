"""The merge of the shares' partial renders across ranks (docs/model.md section 5, "Shares").

A share's partial state per pixel (RenderOptions::partial): m_r, its running maximum
exponent; D_r, its normaliser relative to exp(m_r) without the background; A_r [C], its
feature sum relative to exp(m_r). The blend is a weighted average that does not depend on
the order of the spheres, so the states merge exactly, as an online softmax does:

    m = max_r m_r,  D = exp(s_bg - m) + sum_r D_r exp(m_r - m),
    A = exp(s_bg - m) bg + sum_r A_r exp(m_r - m),  C = A / D,

the background counted once. The depth statistics of the shares' hits merge like partial
variances (merge_depth_statistics). The backward needs only the merged (m, D), C and
depth statistics. Every function here is a collective: every rank of ``group`` calls it,
with tensors of equal shapes.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from ..outputs import forward_info_ids, ids_of_slots, slots_of_ids

Tensor = torch.Tensor


def merge_partial_states(
    partial: Tensor,
    state: Tensor,
    background: Tensor,
    bg_exponent: Union[float, Tensor],
    group: Optional[dist.ProcessGroup],
) -> Tuple[Tensor, Tensor]:
    """The image and the merged blend state of every rank's share.

    Args:
        partial: [..., C] this share's A_r.
        state: [..., 2] this share's (m_r, D_r).
        background: [C] background features.
        bg_exponent: s_bg = beta / gamma.
        group: the process group.

    Returns:
        image [..., C] and the merged state [..., 2] (m, D), equal on every rank. Two
        collectives: a maximum over [...] and a sum over [..., C + 1].
    """
    m_share = state[..., 0]
    m = m_share.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    scale = torch.sub(m_share, m).exp_()  # in (0, 1]: no overflow
    channels = partial.shape[-1]
    sums = partial.new_empty(partial.shape[:-1] + (channels + 1,))
    torch.mul(partial, scale[..., None], out=sums[..., :channels])
    torch.mul(state[..., 1], scale, out=sums[..., channels])
    dist.all_reduce(sums, group=group)
    merged = torch.empty_like(state)
    merged[..., 0] = m
    background_weight = torch.sub(bg_exponent, m).exp_()  # <= 1: m >= s_bg on every share
    torch.add(sums[..., channels], background_weight, out=merged[..., 1])
    image = torch.addcmul(sums[..., :channels], background_weight[..., None], background)
    image.div_(merged[..., 1:])
    return image, merged


def merge_depth_statistics(
    moments: Tensor, state: Tensor, merged_state: Tensor, group: Optional[dist.ProcessGroup]
) -> Tensor:
    """The depth statistics of every rank's share merged (docs/model.md section 5,
    "Shares"): the coverage, mean and variance of all the pixel's hits.

    Args:
        moments: [..., 4] this share's depth statistics (outputs.DEPTH_STATS: coverage,
            mean, variance, low part of the mean), of its own hits.
        state: [..., 2] this share's (m_r, D_r) (D_r without the background).
        merged_state: [..., 2] the merged (m, D) (merge_partial_states).
        group: the process group.

    Returns:
        [..., 4] the merged statistics, equal on every rank (the mean in one value, its low
        part 0). Two collectives: a sum over [..., 2], then one over [...] (the variance's
        deviations need the merged mean first: one pass of raw second moments would lose
        digits where the variance is small against the mean's square).
    """
    weight = state[..., 1] * torch.sub(state[..., 0], merged_state[..., 0]).exp_()  # W_r, relative to exp(m)
    mean_r = moments[..., 1] + moments[..., 3]
    sums = torch.stack((weight, weight * mean_r), dim=-1)
    dist.all_reduce(sums, group=group)
    total = sums[..., 0]
    covered = total > 0
    safe = torch.where(covered, total, torch.ones_like(total))
    mean = torch.where(covered, sums[..., 1] / safe, torch.zeros_like(total))
    spread = weight * (moments[..., 2] + (mean_r - mean) ** 2)
    dist.all_reduce(spread, group=group)
    variance = torch.where(covered, spread / safe, torch.zeros_like(total))
    coverage = total / merged_state[..., 1]
    return torch.stack((coverage, mean, variance, torch.zeros_like(mean)), dim=-1)


def share_offset(n_spheres: int, device: torch.device, group: Optional[dist.ProcessGroup]) -> Tensor:
    """[1] int64: the global index of this rank's first sphere, the shares taken in rank
    order (on the device: no host synchronisation)."""
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, torch.full((1,), n_spheres, dtype=torch.int64, device=device), group=group)
    rank = dist.get_rank(group)
    return sum(counts[:rank], torch.zeros(1, dtype=torch.int64, device=device))


def merge_forward_info(
    info: Tensor, merged_state: Tensor, offset: Tensor, group: Optional[dist.ProcessGroup]
) -> Tensor:
    """Forward info [..., 3 + 2K] of the whole scene from every rank's share of it.

    Args:
        info: [..., 3 + 2K] this share's forward info (include/pulsar/forward_info.h), its
            ids local to the share.
        merged_state: [..., 2] the merged (m, D) (merge_partial_states).
        offset: [1] int64, the global index of the share's first sphere (share_offset).
        group: the process group.

    Returns:
        [..., 3 + 2K]: the merged m and D, the largest closest depth over the shares, and
        the K closest hits over all shares (global ids), closest first; empty slots
        (-1, -1). Hits at equal depth keep rank order. One all-gather of [..., 1 + 2K].
    """
    k = (info.shape[-1] - 3) // 2
    ids = forward_info_ids(info).to(torch.int64)
    ids = torch.where(ids >= 0, ids + offset, ids)
    mine = torch.cat((info[..., 2:3], slots_of_ids(ids, info.dtype), info[..., 4::2]), dim=-1)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    every = torch.stack(gathered, dim=-2)  # [..., R, 1 + 2K]
    max_closest = every[..., 0].amax(dim=-1, keepdim=True)
    all_ids = ids_of_slots(every[..., 1 : 1 + k]).flatten(-2)  # [..., R K], rank-major
    all_depths = every[..., 1 + k :].flatten(-2)
    key = torch.where(all_ids >= 0, all_depths, torch.full_like(all_depths, float("inf")))
    order = torch.sort(key, dim=-1, stable=True).indices[..., :k]
    ids = all_ids.gather(-1, order)
    depths = all_depths.gather(-1, order)
    pairs = torch.stack((slots_of_ids(ids, info.dtype), depths), dim=-1).flatten(-2)
    return torch.cat((merged_state, max_closest, pairs), dim=-1)
