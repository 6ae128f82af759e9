"""Rendering over several processes with torch.distributed (docs/distributed.md).

``ShardedRenderer`` splits the spheres: each rank renders its share of them to a partial
per-pixel state, the states merge exactly into the full image on every rank, and each
rank's backward gives its own spheres' gradients (and the camera's, summed over ranks).
"""

from .sharded import ShardedRenderer

__all__ = ["ShardedRenderer"]
