"""Cameras: ``Camera`` (what users optimise), Pulsar's camera vectors and their conversion
to the native camera, rotation representations and look-at helpers."""

from .camera import Camera
from .params import NativeCamera, camera_from_params

__all__ = ["Camera", "NativeCamera", "camera_from_params"]
