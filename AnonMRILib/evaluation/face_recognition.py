"""An open face detector and recognizer as an independent judge of face renderings (dlib).

Nobody here wrote it, so it is the judge the project quotes for realism and re-identification:

- **detector**: dlib's HOG frontal face detector (``dlib.get_frontal_face_detector``); its
  score is the SVM margin of the best window (> 0 = a face; photographs of faces score ~1-3);
- **landmarks**: the 68-point shape predictor, and the **descriptor**: dlib's ResNet face
  recognition model v1 (128-d, trained on photographs; distance > 0.6 = different person for
  photographs). Weights come from the ``face-recognition-models`` wheel (CC0 / public domain,
  Davis King), read from its installed folder; nothing is downloaded at run time. The wheel's
  ``__init__`` imports ``pkg_resources``, which new setuptools lack, so the folder is found with
  :func:`importlib.util.find_spec` without importing the package.

Renderings are untextured shaded surfaces, not photographs: dlib's distances are compressed on
them (the same head at 1 mm and 1.5 mm ~0.1 apart, different real people ~0.55-0.7), so decide
by rank in a gallery and calibrate thresholds on renderings, never on 0.6.

Input images are AnonMRI renderings: float arrays in [0, 1] (H, W) or uint8; they are converted
to 8-bit RGB. ``upsample`` doubles the image that many times before detection (faces in a
128-pixel rendering are small).

Install: ``pip install dlib-bin face-recognition-models`` (the ``faces`` extra; :data:`INSTALL_COMMAND`).
"""
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DependencyError

#: model files inside the face-recognition-models wheel
SHAPE_PREDICTOR_FILE = "shape_predictor_68_face_landmarks.dat"
DESCRIPTOR_FILE = "dlib_face_recognition_resnet_model_v1.dat"
#: how to install the recognizer (both binary wheels on PyPI; ``pip install -e ".[faces]"`` in a clone)
INSTALL_COMMAND = "pip install dlib-bin face-recognition-models"


def models_folder() -> Path:
    """Folder of the ``face-recognition-models`` wheel's ``.dat`` files (DependencyError if absent)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise DependencyError(f"the open face recognizer needs the face-recognition-models wheel: {INSTALL_COMMAND}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    for name in (SHAPE_PREDICTOR_FILE, DESCRIPTOR_FILE):
        if not (folder / name).is_file():
            raise DependencyError(f"{name} is missing from the face-recognition-models install; reinstall it")
    return folder


def _import_dlib():
    try:
        import dlib  # noqa: F401
    except ImportError:
        raise DependencyError(f"the open face recognizer needs dlib: {INSTALL_COMMAND}") from None
    return dlib


def to_rgb8(image: np.ndarray) -> np.ndarray:
    """A rendering (H, W) float in [0, 1] or uint8, or (H, W, 3) -> contiguous uint8 RGB."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.clip(np.nan_to_num(array.astype(np.float64)) * 255.0 + 0.5, 0, 255).astype(np.uint8)
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an (H, W) or (H, W, 3) image, got shape {array.shape}")
    return np.ascontiguousarray(array)


@dataclass(frozen=True)
class FaceDetection:
    """The best face of an image: detector score (SVM margin) and box (left, top, right, bottom) in pixels."""

    score: float
    box: Tuple[int, int, int, int]


class FaceRecognizer:
    """dlib's HOG detector, 68-landmark aligner and ResNet descriptor, loaded once (see module doc)."""

    def __init__(self, upsample: int = 1, jitters: int = 0) -> None:
        dlib = _import_dlib()
        folder = models_folder()
        self._dlib = dlib
        self.upsample = int(upsample)
        self.jitters = int(jitters)
        self._detector = dlib.get_frontal_face_detector()
        self._shape = dlib.shape_predictor(str(folder / SHAPE_PREDICTOR_FILE))
        self._descriptor = dlib.face_recognition_model_v1(str(folder / DESCRIPTOR_FILE))

    def detect(self, image: np.ndarray) -> Optional[FaceDetection]:
        """The highest-scoring face in ``image``, or None when the detector finds none at any threshold."""
        rgb = to_rgb8(image)
        boxes, scores, _ = self._detector.run(rgb, self.upsample, -1.0)
        if len(boxes) == 0:
            return None
        best = int(np.argmax(scores))
        box = boxes[best]
        return FaceDetection(float(scores[best]), (box.left(), box.top(), box.right(), box.bottom()))

    def descriptor(self, image: np.ndarray, detection: Optional[FaceDetection] = None) -> Optional[np.ndarray]:
        """128-d float64 descriptor of the best face (aligned by its 68 landmarks); None without a face."""
        rgb = to_rgb8(image)
        detection = detection or self.detect(rgb)
        if detection is None:
            return None
        rectangle = self._dlib.rectangle(*detection.box)
        shape = self._shape(rgb, rectangle)
        return np.asarray(self._descriptor.compute_face_descriptor(rgb, shape, self.jitters), dtype=np.float64)

    def describe_views(self, images: Sequence[np.ndarray]) -> Tuple[Optional[np.ndarray], float]:
        """Descriptor of the best-detected face among several views of one head, and its score.

        Returns (None, -inf) when no view has a face.
        """
        best: Tuple[Optional[np.ndarray], float] = (None, float("-inf"))
        for image in images:
            detection = self.detect(image)
            if detection is not None and detection.score > best[1]:
                best = (self.descriptor(image, detection), detection.score)
        return best


def face_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Euclidean distance of two descriptors (dlib's convention)."""
    return float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)))


def rank_of_true(query: np.ndarray, gallery: Sequence[Optional[np.ndarray]], true_index: int) -> int:
    """1-based rank of ``gallery[true_index]`` among gallery descriptors by distance to ``query``.

    Gallery entries without a face (None) rank last; ties count against the true entry.
    """
    distances: List[float] = [face_distance(query, g) if g is not None else float("inf") for g in gallery]
    true_distance = distances[true_index]
    return 1 + sum(1 for i, d in enumerate(distances) if i != true_index and d <= true_distance)
