"""``pulsar_py.Camera``: a differentiable camera made of the tensors users optimise.

Conventions (docs/cameras.md has the figure):

* A world point X has camera coordinates ``x_cam = R X + t`` (R a rotation, t [3]): x to
  the right of the image, y down, z forward (OpenCV). The camera centre is ``-R^T t``.
* Perspective: ``u = fx x/z + cx``, ``v = fy y/z + cy`` (pixels). Orthographic:
  ``u = fx x + cx``, ``v = fy y + cy`` (fx, fy in pixels per world unit).
* Pixel (i, j) (column i, row j) is centred at (u, v) = (i, j); row 0 is the top row of
  the image (the first row of the rendered tensor). No flips.
* ``right_handed=False`` (Pulsar's default system) means a left-handed world: it is
  mirrored into a right-handed one by negating world z first, ``x_cam = R diag(1, 1, -1)
  X + t``. OpenCV, look-at and PyTorch3D cameras are right-handed.

Fields are batched with a leading dim B (a camera built from unbatched inputs has B = 1
and renders unbatched images). They are ordinary tensors: give them ``requires_grad`` (or
build the camera from tensors that have it) and gradients reach them through any render.
The rotation is stored in the parametrisation one optimises (``rotation_repr``: matrix,
quaternion, axis_angle or 6d; see ``pulsar_py.rotations``).
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import _arguments
from ..camera_layouts import VALID_PARAM_LENGTHS, CameraVectorLayout
from .look_at import up_for_view
from .params import NativeCamera
from .rotations import (
    ROTATION_SHAPES,
    axis_angle_to_matrix,
    check_rotation_repr,
    matrix_to_rotation,
    rotation_6d_to_matrix,
    rotation_to_matrix,
)
from .vectors import cross3, dot3, matvec3, normalize3

#: Default distance of the native film from the eye, in world units (perspective). Any
#: positive value renders the same image; the near plane must lie beyond it (min_depth > it;
#: min_depth = 0 means film distance + 2e-6).
DEFAULT_FILM_DISTANCE = 1e-3
#: Camera.look_at's vertical field of view (degrees) when none is given.
DEFAULT_FOV_Y = 60.0
#: Largest |R R^T - I| entry accepted for a rotation given as a matrix.
ORTHONORMAL_TOLERANCE = 1e-3
#: Mirror of world z: turns a left-handed world into a right-handed one.
_MIRROR_Z = (1.0, 1.0, -1.0)

Scalar = Union[float, torch.Tensor]
ImageSize = Tuple[int, int]
#: Points or directions [B?, 3]: a tensor, or Python numbers: (x, y, z) or a list of triples.
Points3 = Union[torch.Tensor, Sequence[float], Sequence[Sequence[float]]]


def _tan_half_fov(name: str, degrees: float) -> float:
    """tan(degrees / 2) of a field of view in (0, 180) degrees; ValueError naming ``name``
    otherwise. Half the image's side over it is the focal length in pixels."""
    return math.tan(math.radians(_arguments.check_float(name, degrees, 0.0, 180.0, low_open=True, high_open=True)) / 2)


def _check_image_size(image_size: object) -> ImageSize:
    if (
        not isinstance(image_size, (tuple, list))
        or len(image_size) != 2
        or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in image_size)
    ):
        raise TypeError(f"image_size: expected (height, width) as two ints, got {image_size!r}")
    image_size = (int(image_size[0]), int(image_size[1]))
    height = _arguments.check_int("image_size[0] (height)", image_size[0], 1, _arguments.MAX_IMAGE_SIDE)
    width = _arguments.check_int("image_size[1] (width)", image_size[1], 1, _arguments.MAX_IMAGE_SIDE)
    return height, width


def _as_tensor(name: str, value: object, like: torch.Tensor) -> torch.Tensor:
    """A tensor argument in ``like``'s dtype and device (Python numbers are converted)."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _arguments.FLOAT_DTYPES:
            raise TypeError(f"{name}: expected dtype float32 or float64, got {value.dtype}")
        if value.dtype != like.dtype:
            raise TypeError(f"{name}: expected dtype {like.dtype} like the other camera tensors, got {value.dtype}")
        if value.device != like.device:
            raise ValueError(
                f"{name}: expected a tensor on {like.device} like the other camera tensors, got {value.device}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, Sequence)):
        raise TypeError(f"{name}: expected a tensor or numbers, got {type(value).__name__}")
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def _reference_tensor(
    *values: object, dtype: Optional[torch.dtype] = None, device: Optional[Union[str, torch.device]] = None
) -> torch.Tensor:
    """The first tensor argument (dtype and device of the camera); with none, an empty
    tensor of ``dtype`` (default: torch's default dtype) on ``device`` (default: CPU)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.dtype not in _arguments.FLOAT_DTYPES:
                raise TypeError(f"camera tensors: expected dtype float32 or float64, got {v.dtype}")
            if dtype is not None and v.dtype != dtype:
                raise TypeError(f"dtype: {dtype} asked for, but the camera's tensors are {v.dtype}")
            return v if device is None else v.to(device)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in _arguments.FLOAT_DTYPES:
        raise TypeError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
    return torch.empty(0, dtype=dtype, device=device)


def _batch_fields(fields: Dict[str, Tuple[torch.Tensor, int]]) -> Tuple[Dict[str, torch.Tensor], int, bool]:
    """Give every field a leading batch dim B.

    fields: name -> (tensor, rank of one camera's value). A tensor of that rank, or a
    batch of 1, is shared by all cameras (expanded, so its gradient sums over them); one
    more dim is a batch. Returns the batched fields, B and whether any input was batched.
    """
    sizes = {}
    for name, (t, rank) in fields.items():
        if t.dim() == rank + 1:
            sizes[name] = t.shape[0]
        elif t.dim() != rank:
            raise ValueError(
                f"{name}: expected {rank} dims (one camera) or {rank + 1} (a batch), got shape {tuple(t.shape)}"
            )
    batch = max(sizes.values(), default=1)
    for name, size in sizes.items():
        if size not in (1, batch):
            raise ValueError(
                f"{name}: expected a batch of {batch} cameras like "
                f"{', '.join(n for n, s in sizes.items() if s == batch)}, got {size}"
            )
    out = {}
    for name, (t, rank) in fields.items():
        t = t if t.dim() == rank + 1 else t.unsqueeze(0)
        out[name] = t if t.shape[0] == batch else t.expand((batch,) + tuple(t.shape[1:]))
    return out, batch, bool(sizes)


class Camera:
    """A batch of B pinhole or orthographic cameras (see the module docstring).

    Args:
        rotation: [B?, *shape] world-to-camera rotation in the parametrisation
            ``rotation_repr`` (matrix [3, 3], quaternion (w, x, y, z) [4], axis_angle [3],
            6d [6]).
        translation: [B?, 3] t of ``x_cam = R X + t`` (world units).
        fx, fy: [B?] or numbers: focal lengths in pixels (perspective) or pixels per world
            unit (orthographic), > 0.
        cx, cy: [B?] or numbers: principal point in pixels; pixel (i, j) is centred at
            (u, v) = (i, j).
        image_size: (height, width) in pixels.
        rotation_repr: "matrix", "quaternion", "axis_angle" or "6d".
        orthographic: orthographic instead of perspective projection.
        right_handed: False for a left-handed world (mirrored by negating world z).
        film_distance: [B?] or number: distance of the native film from the eye (world
            units, perspective only; default 1e-3). It does not change the image, but
            min_depth must exceed it, and min_depth = 0 means film_distance + 2e-6.

    Every tensor may require grad; rendering differentiates through all of them.
    """

    def __init__(
        self,
        rotation: torch.Tensor,
        translation: torch.Tensor,
        fx: Scalar,
        fy: Scalar,
        cx: Scalar,
        cy: Scalar,
        image_size: ImageSize,
        *,
        rotation_repr: str = "matrix",
        orthographic: bool = False,
        right_handed: bool = True,
        film_distance: Optional[Scalar] = None,
    ) -> None:
        self.rotation_repr = check_rotation_repr("rotation_repr", rotation_repr)
        self.image_size = _check_image_size(image_size)
        self.orthographic = bool(orthographic)
        self.right_handed = bool(right_handed)
        like = _reference_tensor(translation, rotation, fx, fy, cx, cy)
        if not isinstance(rotation, torch.Tensor):
            raise TypeError(f"rotation: expected a torch.Tensor, got {type(rotation).__name__}")
        if not isinstance(translation, torch.Tensor):
            raise TypeError(f"translation: expected a torch.Tensor, got {type(translation).__name__}")
        rot_shape = ROTATION_SHAPES[self.rotation_repr]
        if tuple(rotation.shape[rotation.dim() - len(rot_shape) :]) != rot_shape or rotation.dim() < len(rot_shape):
            raise ValueError(
                f"rotation: expected shape [B?, {', '.join(map(str, rot_shape))}] for rotation_repr "
                f"{self.rotation_repr!r}, got {tuple(rotation.shape)}"
            )
        if translation.shape[-1:] != (3,):
            raise ValueError(f"translation: expected shape [B?, 3], got {tuple(translation.shape)}")
        if film_distance is None:
            film_distance = 0.0 if self.orthographic else DEFAULT_FILM_DISTANCE
        tensors = {
            "rotation": (_as_tensor("rotation", rotation, like), len(rot_shape)),
            "translation": (_as_tensor("translation", translation, like), 1),
            "fx": (_as_tensor("fx", fx, like), 0),
            "fy": (_as_tensor("fy", fy, like), 0),
            "cx": (_as_tensor("cx", cx, like), 0),
            "cy": (_as_tensor("cy", cy, like), 0),
            "film_distance": (_as_tensor("film_distance", film_distance, like), 0),
        }
        fields, self._batch_size, self.batched = _batch_fields(tensors)
        self.rotation: torch.Tensor = fields["rotation"]
        self.translation: torch.Tensor = fields["translation"]
        self.fx: torch.Tensor = fields["fx"]
        self.fy: torch.Tensor = fields["fy"]
        self.cx: torch.Tensor = fields["cx"]
        self.cy: torch.Tensor = fields["cy"]
        self.film_distance: torch.Tensor = fields["film_distance"]

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_opencv(
        cls,
        K: torch.Tensor,
        R: torch.Tensor,
        t: torch.Tensor,
        image_size: ImageSize,
        *,
        rotation_repr: str = "matrix",
        film_distance: Optional[Scalar] = None,
    ) -> "Camera":
        """An OpenCV calibration: ``x_cam = R X + t``, ``[u, v, 1] ~ K x_cam``.

        Args:
            K: [B?, 3, 3] intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` (no skew).
            R: [B?, 3, 3] world-to-camera rotation (e.g. ``cv2.Rodrigues(rvec)``).
            t: [B?, 3] translation (``tvec``).
            image_size: (height, width). Note: OpenCV functions take (width, height).
            rotation_repr: the parametrisation to store (and optimise) R in.
            film_distance: see ``Camera``.

        fx, fy, cx, cy are read from K (gradients flow back to K); the rendered image has
        row 0 at v = 0, as OpenCV's.
        """
        if not isinstance(K, torch.Tensor):
            raise TypeError(f"K: expected a torch.Tensor, got {type(K).__name__}")
        if K.shape[-2:] != (3, 3) or K.dim() not in (2, 3):
            raise ValueError(f"K: expected shape [B?, 3, 3], got {tuple(K.shape)}")
        _arguments.check_finite("K", K.detach())
        last_row = torch.tensor([0.0, 0.0, 1.0], dtype=K.dtype, device=K.device)
        if not bool((K[..., 2, :].detach() == last_row).all()):
            raise ValueError(f"K: expected a last row (0, 0, 1), got {K[..., 2, :].detach().tolist()}")
        if bool((K[..., 0, 1].detach() != 0).any()) or bool((K[..., 1, 0].detach() != 0).any()):
            raise ValueError(
                f"K: expected no skew (K[0, 1] = K[1, 0] = 0), got {K[..., 0, 1].detach().tolist()}, "
                f"{K[..., 1, 0].detach().tolist()}"
            )
        if bool((K[..., 0, 0].detach() <= 0).any()) or bool((K[..., 1, 1].detach() <= 0).any()):
            raise ValueError(
                f"K: expected fx = K[0, 0] > 0 and fy = K[1, 1] > 0, got "
                f"{K[..., 0, 0].detach().tolist()}, {K[..., 1, 1].detach().tolist()}"
            )
        _check_rotation_matrix("R", R, K)
        return cls(
            matrix_to_rotation(R, check_rotation_repr("rotation_repr", rotation_repr)),
            t,
            K[..., 0, 0],
            K[..., 1, 1],
            K[..., 0, 2],
            K[..., 1, 2],
            image_size,
            rotation_repr=rotation_repr,
            film_distance=film_distance,
        )

    @classmethod
    def from_orthographic(
        cls,
        R: torch.Tensor,
        t: torch.Tensor,
        fx: Scalar,
        fy: Optional[Scalar] = None,
        cx: Optional[Scalar] = None,
        cy: Optional[Scalar] = None,
        *,
        image_size: ImageSize,
        rotation_repr: str = "matrix",
        right_handed: bool = True,
    ) -> "Camera":
        """An orthographic camera: ``x_cam = R X + t``, ``u = fx x + cx``, ``v = fy y + cy``.

        Args:
            R: [B?, 3, 3] world-to-camera rotation; t: [B?, 3].
            fx, fy: pixels per world unit (fy defaults to fx).
            cx, cy: principal point in pixels (default: the image centre,
                ((width - 1) / 2, (height - 1) / 2)).
            image_size: (height, width).
        Rays run along the camera's +z; spheres count from the plane z_cam = 0
        (min_depth, max_depth are z_cam distances from it).
        """
        height, width = _check_image_size(image_size)
        _check_rotation_matrix("R", R, _reference_tensor(R, t))
        return cls(
            matrix_to_rotation(R, check_rotation_repr("rotation_repr", rotation_repr)),
            t,
            fx,
            fx if fy is None else fy,
            (width - 1) / 2 if cx is None else cx,
            (height - 1) / 2 if cy is None else cy,
            (height, width),
            rotation_repr=rotation_repr,
            orthographic=True,
            right_handed=right_handed,
        )

    @classmethod
    def look_at(
        cls,
        eye: Points3,
        target: Points3,
        up: Points3 = (0.0, 1.0, 0.0),
        *,
        image_size: ImageSize,
        fov_y: Optional[float] = None,
        fov_x: Optional[float] = None,
        fx: Optional[Scalar] = None,
        fy: Optional[Scalar] = None,
        cx: Optional[Scalar] = None,
        cy: Optional[Scalar] = None,
        orthographic: bool = False,
        right_handed: bool = True,
        rotation_repr: str = "matrix",
        film_distance: Optional[Scalar] = None,
        dtype: Optional[torch.dtype] = None,
        device: Optional[Union[str, torch.device]] = None,
    ) -> "Camera":
        """A camera at ``eye`` looking at ``target`` with ``up`` upwards in the image.

        Args:
            eye, target: [B?, 3] world points; up: [B?, 3] world direction (tensors, or
                Python numbers: ``(0, 0, -5)`` or a list of such triples). Where up is
                parallel to target - eye (a camera straight above or below the target),
                the image's up is the fallback of ``look_at.up_for_view``: world -z
                looking down, +z looking up, for up = +y.
            image_size: (height, width).
            fov_y: vertical field of view in degrees (perspective; default 60 when none of
                fov_x, fx, fy is given): fy = (height / 2) / tan(fov_y / 2).
            fov_x: horizontal field of view in degrees, instead of or with fov_y:
                fx = (width / 2) / tan(fov_x / 2).
            fx, fy: focal lengths in pixels (perspective) or pixels per world unit
                (orthographic: fx is required), instead of the fields of view; a missing
                one equals the other (square pixels).
            cx, cy: principal point (default: the image centre).
            orthographic, right_handed, rotation_repr, film_distance: see ``Camera``.
            dtype, device: of the camera when eye, target and up are Python numbers
                (default: torch's default dtype, float32 unless changed, on the CPU);
                tensors give theirs.
        The construction is differentiable in eye and target.
        """
        height, width = _check_image_size(image_size)
        like = _reference_tensor(eye, target, up, dtype=dtype, device=device)
        eye_t, target_t, up_t = (_as_tensor(n, v, like) for n, v in (("eye", eye), ("target", target), ("up", up)))
        for name, v in (("eye", eye_t), ("target", target_t), ("up", up_t)):
            if v.shape[-1:] != (3,) or v.dim() not in (1, 2):
                raise ValueError(f"{name}: expected shape [B?, 3], got {tuple(v.shape)}")
            _arguments.check_finite(name, v.detach())
        forward = target_t - eye_t
        if bool((dot3(forward, forward).detach() == 0).any()):
            raise ValueError(f"eye, target: expected different points, got eye == target ({eye_t.tolist()})")
        # Straight above or below the target (up parallel to the view): the fallback up.
        up_t = up_for_view(up_t, forward.detach())
        if not right_handed:
            # Left-handed world: build the camera in its mirror image (world z negated).
            mirror = torch.tensor(_MIRROR_Z, dtype=like.dtype, device=like.device)
            eye_t, target_t, up_t = eye_t * mirror, target_t * mirror, up_t * mirror
            forward = target_t - eye_t
        # Element-wise vector maths throughout (as camera_params): a batch of cameras
        # converts bitwise like its items.
        z_axis = normalize3(forward)
        # x (image right) = z x up: with y = z x x pointing down, -up appears downwards.
        x_axis = normalize3(cross3(z_axis, up_t.expand_as(z_axis)))
        y_axis = cross3(z_axis, x_axis)
        matrix = torch.stack([x_axis, y_axis, z_axis], dim=-2)  # rows: camera axes in world
        translation = -matvec3(matrix, eye_t.expand_as(z_axis))
        if fx is None and fy is None:
            if orthographic:
                raise ValueError("fx: expected pixels per world unit for an orthographic look_at camera, got None")
            if fov_y is None and fov_x is None:
                fov_y = DEFAULT_FOV_Y
            if fov_y is not None:
                fy = (height / 2) / _tan_half_fov("fov_y", fov_y)
            if fov_x is not None:
                fx = (width / 2) / _tan_half_fov("fov_x", fov_x)
        elif fov_y is not None or fov_x is not None:
            fovs = {name: value for name, value in (("fov_y", fov_y), ("fov_x", fov_x)) if value is not None}
            given = ", ".join(f"{name}={value}" for name, value in fovs.items())
            raise ValueError(
                f"{', '.join(fovs)}: give either a field of view or fx/fy, got {given} and fx={fx}, fy={fy}"
            )
        fx, fy = (fy if fx is None else fx), (fx if fy is None else fy)
        return cls(
            matrix_to_rotation(matrix, check_rotation_repr("rotation_repr", rotation_repr)),
            translation,
            fx,
            fy,
            (width - 1) / 2 if cx is None else cx,
            (height - 1) / 2 if cy is None else cy,
            (height, width),
            rotation_repr=rotation_repr,
            orthographic=orthographic,
            right_handed=right_handed,
            film_distance=film_distance,
        )

    @classmethod
    def from_params(
        cls,
        cam_params: torch.Tensor,
        width: int,
        height: int,
        orthogonal: bool = False,
        right_handed: bool = False,
        first_R_then_T: bool = False,
    ) -> "Camera":
        """Pulsar camera vectors [B?, L], L in {8, 10, 11, 13} (model.md section 2).

        The camera renders the same image as ``cam_params`` on a renderer built with
        ``orthogonal_projection=orthogonal, right_handed_system=right_handed``; gradients
        flow back to ``cam_params``. Its rotation is stored as a matrix. The focal length
        becomes the film distance (perspective; it keeps its "min_depth = 0" meaning) and
        is ignored for orthographic cameras.
        """
        width = _arguments.check_int("width", width, 1, _arguments.MAX_IMAGE_SIDE)
        height = _arguments.check_int("height", height, 1, _arguments.MAX_IMAGE_SIDE)
        params = _arguments.check_tensor("cam_params", cam_params, dims=(1, 2))
        if params.shape[-1] not in VALID_PARAM_LENGTHS:
            raise ValueError(
                f"cam_params: expected a last dimension of 8, 10, 11 or 13 values, got shape {tuple(params.shape)}"
            )
        layout = CameraVectorLayout.of(params.shape[-1])
        rot = layout.rotation(params)
        m = rotation_6d_to_matrix(rot) if layout.rotation_size == 6 else axis_angle_to_matrix(rot)
        position = layout.position(params)
        if first_R_then_T:
            position = matvec3(m, position)
        # Camera axes in world: right = M e1, down = -M e2, forward = +-M e3. Rows of A.
        signs = torch.tensor([1.0, -1.0, -1.0 if right_handed else 1.0], dtype=params.dtype, device=params.device)
        world_to_camera = m.transpose(-1, -2) * signs[:, None]
        translation = -matvec3(world_to_camera, position)
        focal, sensor_width = layout.focal(params), layout.sensor_width(params)
        pixels_per_unit = width / sensor_width  # 1 / pixel size
        if layout.has_offsets:
            offset_x, offset_y = layout.offsets(params)
        else:
            offset_x = offset_y = torch.zeros_like(focal)
        # Pulsar's offsets move the optical axis left/up from the image centre.
        cx, cy = (width - 1) / 2 - offset_x, (height - 1) / 2 - offset_y
        f_px = pixels_per_unit if orthogonal else focal * pixels_per_unit
        camera = cls(
            _world_to_camera_to_rotation(world_to_camera, right_handed),
            translation,
            f_px,
            f_px,
            cx,
            cy,
            (height, width),
            orthographic=orthogonal,
            right_handed=right_handed,
            film_distance=None if orthogonal else focal,
        )
        return camera

    # ---------------------------------------------------------------- geometry
    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def dtype(self) -> torch.dtype:
        return self.translation.dtype

    @property
    def device(self) -> torch.device:
        return self.translation.device

    @property
    def height(self) -> int:
        return self.image_size[0]

    @property
    def width(self) -> int:
        return self.image_size[1]

    def rotation_matrix(self) -> torch.Tensor:
        """[B, 3, 3] the rotation R (world-to-camera, of the right-handed world)."""
        return rotation_to_matrix(self.rotation, self.rotation_repr)

    def world_to_camera(self) -> torch.Tensor:
        """[B, 3, 3] the linear part A of ``x_cam = A X + t`` in the user's world: R, or
        R diag(1, 1, -1) for a left-handed world. Its rows are the camera's right, down
        and forward directions in world coordinates."""
        matrix = self.rotation_matrix()
        if self.right_handed:
            return matrix
        return matrix * torch.tensor(_MIRROR_Z, dtype=matrix.dtype, device=matrix.device)

    def centre(self) -> torch.Tensor:
        """[B, 3] camera centre in world coordinates, ``-A^T t`` (orthographic: the origin
        of the camera frame)."""
        return -matvec3(self.world_to_camera().transpose(-1, -2), self.translation)

    def project(self, points: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Pixel coordinates of world points.

        Args:
            points: [N, 3] or [B, N, 3] world points.
        Returns:
            uv [B, N, 2] (pixel (i, j) is centred at (i, j)) and z_cam [B, N].
        """
        x_cam = matvec3(self.world_to_camera()[:, None], points) + self.translation[:, None]
        x, y, z = x_cam.unbind(-1)
        if self.orthographic:
            u, v = self.fx[:, None] * x + self.cx[:, None], self.fy[:, None] * y + self.cy[:, None]
        else:
            u, v = self.fx[:, None] * x / z + self.cx[:, None], self.fy[:, None] * y / z + self.cy[:, None]
        return torch.stack([u, v], -1), z

    def native(self, width: int, height: int) -> NativeCamera:
        """The general camera the native core reads (model.md section 2), differentiable.

        ``width, height`` must equal ``image_size`` (the principal point and focal
        lengths are in pixels of that size).
        """
        if (height, width) != self.image_size:
            raise ValueError(
                f"camera: expected image_size (height, width) = ({height}, {width}) like the renderer, "
                f"got {self.image_size}"
            )
        axes = self.world_to_camera()
        right, down, forward = axes[:, 0], axes[:, 1], axes[:, 2]
        eye = self.centre()
        if self.orthographic:
            pdx = right / self.fx[:, None]
            pdy = down / self.fy[:, None]
            film = torch.zeros_like(self.fx)
            p00_rel = -self.cx[:, None] * pdx - self.cy[:, None] * pdy  # the film passes through the eye
        else:
            film = self.film_distance
            pdx = right * (film / self.fx)[:, None]
            pdy = down * (film / self.fy)[:, None]
            # Pixel (i, j) sits at film * (x, y, 1) in camera axes, x = (i - cx) / fx.
            p00_rel = film[:, None] * forward - self.cx[:, None] * pdx - self.cy[:, None] * pdy
        return NativeCamera(
            eye=eye,
            p00_rel=p00_rel,
            pdx=pdx,
            pdy=pdy,
            focal=film,
            right_handed=self.right_handed,
            orthographic=self.orthographic,
        )

    # ---------------------------------------------------------------- conversions back
    def to_opencv(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K [B?, 3, 3], R [B?, 3, 3], t [B?, 3]) of a perspective right-handed camera."""
        if self.orthographic:
            raise ValueError("camera: to_opencv needs a perspective camera, got an orthographic one")
        if not self.right_handed:
            raise ValueError(
                "camera: to_opencv needs a right-handed camera (OpenCV's world is right-handed), "
                "got right_handed=False; mirror the world's z to convert"
            )
        zero, one = torch.zeros_like(self.fx), torch.ones_like(self.fx)
        K = torch.stack([self.fx, zero, self.cx, zero, self.fy, self.cy, zero, zero, one], -1).reshape(-1, 3, 3)
        return self._unbatch(K), self._unbatch(self.rotation_matrix()), self._unbatch(self.translation)

    def to_params(self, rotation: str = "axis_angle", focal_length: Optional[Scalar] = None) -> torch.Tensor:
        """Pulsar camera vectors [B?, L] that render this camera's image.

        Args:
            rotation: "axis_angle" (L = 10) or "6d" (L = 13); principal-point offsets
                are always included.
            focal_length: the vector's focal length (perspective; default the film
                distance). Orthographic vectors have focal length 0.

        Use them on a renderer built with ``orthogonal_projection=self.orthographic``,
        ``right_handed_system=self.right_handed`` and ``first_R_then_T=False``. Pulsar's
        pixels are square: ValueError unless fx == fy.
        """
        if rotation not in ("axis_angle", "6d"):
            raise ValueError(f"rotation: expected 'axis_angle' or '6d', got {rotation!r}")
        if not torch.allclose(self.fx.detach(), self.fy.detach(), rtol=1e-6, atol=0):
            raise ValueError(
                f"camera: Pulsar vectors need square pixels (fx == fy), got fx={self.fx.tolist()}, "
                f"fy={self.fy.tolist()}"
            )
        height, width = self.image_size
        axes = self.world_to_camera()
        signs = torch.tensor([1.0, -1.0, -1.0 if self.right_handed else 1.0], dtype=axes.dtype, device=axes.device)
        m = (axes * signs[:, None]).transpose(-1, -2)  # Pulsar's M: columns right, up, +-forward
        if rotation == "axis_angle":
            rot = matrix_to_rotation(m, "axis_angle")
        else:
            rot = m[..., :2, :].reshape(-1, 6)
        if self.orthographic:
            focal = torch.zeros_like(self.fx)
            sensor_width = width / self.fx
        else:
            focal = (
                self.film_distance
                if focal_length is None
                else torch.as_tensor(focal_length, dtype=self.dtype, device=self.device).expand_as(self.fx)
            )
            sensor_width = width * focal / self.fx
        offsets = torch.stack([(width - 1) / 2 - self.cx, (height - 1) / 2 - self.cy], -1)
        params = torch.cat([self.centre(), rot, focal[:, None], sensor_width[:, None], offsets], -1)
        return self._unbatch(params)

    def with_rotation_repr(self, rotation_repr: str) -> "Camera":
        """The same camera with its rotation stored as ``rotation_repr`` (converted with
        torch code; differentiable away from the conversion's branch switches)."""
        rotation_repr = check_rotation_repr("rotation_repr", rotation_repr)
        return self._replace(
            rotation=matrix_to_rotation(self.rotation_matrix(), rotation_repr), rotation_repr=rotation_repr
        )

    # ---------------------------------------------------------------- tensor plumbing
    def tensors(self) -> Dict[str, torch.Tensor]:
        """The camera's tensors by name (each [B, ...])."""
        return dict(
            rotation=self.rotation,
            translation=self.translation,
            fx=self.fx,
            fy=self.fy,
            cx=self.cx,
            cy=self.cy,
            film_distance=self.film_distance,
        )

    def parameters(self, film_distance: bool = False) -> List[torch.Tensor]:
        """The tensors an optimiser updates: rotation, translation, fx, fy, cx, cy (and
        the film distance if asked; it does not change the image)."""
        names = ["rotation", "translation", "fx", "fy", "cx", "cy"] + (["film_distance"] if film_distance else [])
        return [getattr(self, n) for n in names]

    def detach(self) -> "Camera":
        """A camera of detached copies of the tensors (fresh leaves)."""
        return self._map(lambda t: t.detach().clone())

    def requires_grad_(self, requires_grad: bool = True) -> "Camera":
        """Set ``requires_grad`` on the optimisable tensors (they must be leaves, e.g.
        after ``detach()``); returns self."""
        for t in self.parameters():
            t.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs) -> "Camera":
        """``Tensor.to`` applied to every tensor (device and/or dtype)."""
        return self._map(lambda t: t.to(*args, **kwargs))

    def __getitem__(self, index) -> "Camera":
        """An int picks one camera (unbatched); a slice or index tensor picks a batch."""
        if isinstance(index, int):
            index = slice(index, index + 1) if index != -1 else slice(-1, None)
            if not -self.batch_size <= (index.start or 0) < self.batch_size:
                raise IndexError(f"camera index {index.start} out of range for batch size {self.batch_size}")
            out = self._map(lambda t: t[index])
            out.batched = False
            return out
        out = self._map(lambda t: t[index])
        out.batched = True
        return out

    def __len__(self) -> int:
        return self.batch_size

    def __repr__(self) -> str:
        kind = "orthographic" if self.orthographic else "perspective"
        hand = "right-handed" if self.right_handed else "left-handed"
        return (
            f"Camera(B={self.batch_size}{'' if self.batched else ' (unbatched)'}, {kind}, {hand}, "
            f"image_size={self.image_size}, rotation_repr={self.rotation_repr!r}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    # ---------------------------------------------------------------- validation
    def add_value_checks(self, checks: "_arguments.DeferredValueChecks") -> None:
        """Add the value checks (finite, fx, fy > 0, film distance > 0 for perspective, a
        rotation matrix close to orthonormal) to deferred checks."""
        for name, t in self.tensors().items():
            checks.finite(f"camera.{name}", t)
        for name in ("fx", "fy"):
            t = getattr(self, name)
            checks.add(
                (t <= 0).any(),
                lambda t=t, name=name: _arguments.fail(f"camera.{name}: expected values > 0, got {t.min().item()}"),
            )
        if not self.orthographic:
            film = self.film_distance
            checks.add(
                (film <= 0).any(),
                lambda: _arguments.fail(
                    f"camera.film_distance: expected values > 0 for a perspective camera, got {film.min().item()}"
                ),
            )
        if self.rotation_repr == "matrix":
            error = _orthonormality_error(self.rotation.detach())
            checks.add(
                error > ORTHONORMAL_TOLERANCE,
                lambda: _arguments.fail(
                    f"camera.rotation: expected a rotation matrix (|R R^T - I| <= {ORTHONORMAL_TOLERANCE}, det > 0), "
                    f"got an error of {error.item():.3g}; optimise a quaternion, axis_angle or 6d rotation instead "
                    "(Camera.with_rotation_repr)"
                ),
            )
        elif self.rotation_repr == "quaternion":
            checks.add(
                (self.rotation == 0).all(-1).any(),
                lambda: _arguments.fail("camera.rotation: expected non-zero quaternions"),
            )

    def validate(self) -> "Camera":
        """Run the value checks now (ValueError naming the field); returns self."""
        checks = _arguments.DeferredValueChecks()
        self.add_value_checks(checks)
        checks.run()
        return self

    # ---------------------------------------------------------------- internals
    def _unbatch(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.batched else t[0]

    def _map(self, fn) -> "Camera":
        out = object.__new__(Camera)
        out.__dict__.update(self.__dict__)
        for name, t in self.tensors().items():
            setattr(out, name, fn(t))
        out._batch_size = int(out.translation.shape[0])
        return out

    def _replace(self, **changes) -> "Camera":
        out = object.__new__(Camera)
        out.__dict__.update(self.__dict__)
        out.__dict__.update(changes)
        return out


def _world_to_camera_to_rotation(world_to_camera: torch.Tensor, right_handed: bool) -> torch.Tensor:
    """R of a world-to-camera map A: A itself, or A diag(1, 1, -1) for a left-handed world."""
    if right_handed:
        return world_to_camera
    return world_to_camera * torch.tensor(_MIRROR_Z, dtype=world_to_camera.dtype, device=world_to_camera.device)


def _orthonormality_error(matrix: torch.Tensor) -> torch.Tensor:
    """0-dim: max |R R^T - I| entry, or inf where det(R) <= 0."""
    eye = torch.eye(3, dtype=matrix.dtype, device=matrix.device)
    error = (matrix @ matrix.transpose(-1, -2) - eye).abs().amax()
    return torch.where((torch.linalg.det(matrix) <= 0).any(), torch.full_like(error, math.inf), error)


def _check_rotation_matrix(name: str, matrix: object, like: torch.Tensor) -> None:
    if not isinstance(matrix, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(matrix).__name__}")
    _as_tensor(name, matrix, like)
    if matrix.shape[-2:] != (3, 3) or matrix.dim() not in (2, 3):
        raise ValueError(f"{name}: expected shape [B?, 3, 3], got {tuple(matrix.shape)}")
    _arguments.check_finite(name, matrix.detach())
    error = float(_orthonormality_error(matrix.detach()))
    if error > ORTHONORMAL_TOLERANCE:
        raise ValueError(
            f"{name}: expected a rotation matrix (|R R^T - I| <= {ORTHONORMAL_TOLERANCE}, det > 0), "
            f"got an error of {error:.3g}"
        )
