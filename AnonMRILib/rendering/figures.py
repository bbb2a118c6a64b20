"""Before/after figures of renderings: labelled side-by-side panels and atomic PNG writing (Pillow)."""
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from ..errors import InputError

#: pixels of the label strip above each panel
LABEL_HEIGHT = 14
#: pixels of black between panels
GAP = 2


def _as_unit_float(image: np.ndarray) -> np.ndarray:
    """A 2-D float32 image in [0, 1] from a float image in [0, 1] or a uint8 image."""
    image = np.asarray(image)
    if image.ndim != 2:
        raise InputError(f"expected a 2-D grey image, got shape {image.shape}")
    if image.dtype == np.uint8:
        return image.astype(np.float32) / 255.0
    image = np.nan_to_num(image.astype(np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return np.clip(image, 0.0, 1.0)


def _resize_to_height(image: np.ndarray, height: int) -> np.ndarray:
    if image.shape[0] == height:
        return image
    from PIL import Image

    width = max(1, int(round(image.shape[1] * height / image.shape[0])))
    pil = Image.fromarray(np.round(image * 255.0).astype(np.uint8)).resize((width, height), Image.BILINEAR)
    return np.asarray(pil, dtype=np.float32) / 255.0


def side_by_side(images: Sequence[np.ndarray], labels: Optional[Sequence[str]] = None,
                 columns: Optional[int] = None) -> np.ndarray:
    """Panels in a row (or a grid of ``columns`` per row), each with its label above it.

    Images are 2-D floats in [0, 1] (or uint8); all are scaled to the first one's height.
    Returns a float32 image in [0, 1]; labels are drawn in white with Pillow's default font.
    """
    from PIL import Image, ImageDraw

    if len(images) == 0:
        raise InputError("side_by_side needs at least one image")
    if labels is not None and len(labels) != len(images):
        raise InputError(f"{len(images)} images but {len(labels)} labels")
    panels = [_as_unit_float(image) for image in images]
    height = panels[0].shape[0]
    panels = [_resize_to_height(panel, height) for panel in panels]
    width = max(panel.shape[1] for panel in panels)
    columns = len(panels) if columns is None else max(1, min(int(columns), len(panels)))
    rows = (len(panels) + columns - 1) // columns
    label_height = LABEL_HEIGHT if labels is not None else 0
    cell_h, cell_w = height + label_height, width
    canvas = np.zeros((rows * cell_h + (rows - 1) * GAP, columns * cell_w + (columns - 1) * GAP), np.float32)
    for index, panel in enumerate(panels):
        row, column = divmod(index, columns)
        top, left = row * (cell_h + GAP) + label_height, column * (cell_w + GAP)
        left += (cell_w - panel.shape[1]) // 2
        canvas[top:top + height, left:left + panel.shape[1]] = panel
    if labels is not None:
        pil = Image.fromarray(np.round(canvas * 255.0).astype(np.uint8))
        draw = ImageDraw.Draw(pil)
        for index, label in enumerate(labels):
            row, column = divmod(index, columns)
            draw.text((column * (cell_w + GAP) + 3, row * (cell_h + GAP) + 1), str(label), fill=255)
        canvas = np.asarray(pil, dtype=np.float32) / 255.0
    return canvas


def check_png_path(path: Union[str, Path], inputs: Iterable[Union[str, Path, None]] = ()) -> Path:
    """Validate a PNG output path before any work: .png name, existing folder, not an input file."""
    from ..io.writers import check_destination

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise InputError(f"{path}: a rendering is written as PNG; use a .png file name")
    return check_destination(path, [source for source in inputs if source is not None])


def save_png(image: np.ndarray, path: Union[str, Path]) -> Path:
    """Write a 2-D grey image (float in [0, 1] or uint8) as an 8-bit PNG, atomically (missing
    folders are created, as for every output)."""
    from PIL import Image

    path = check_png_path(path)
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    pixels = np.round(_as_unit_float(image) * 255.0).astype(np.uint8)
    handle, temporary = tempfile.mkstemp(prefix=".tmp_", suffix=".png", dir=str(parent))
    os.close(handle)
    try:
        Image.fromarray(pixels).save(temporary, format="PNG", optimize=True)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)             # mkstemp's 0600 -> the usual file mode
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path
