#!/usr/bin/env python
"""Build the DEFACE baseline's shipped template: pydeface's average head and face mask at 2 mm.

Writes ``AnonMRILib/data/templates/deface_template_T1w.nii.gz`` (uint8, intensities scaled so that
the 99.9th percentile is 255) and ``deface_template_facemask.nii.gz`` (uint8, 1 = face, to be
removed; pydeface's own mask uses 0 for the face) on the same 2 mm grid, cropped to the head plus
a margin, and ``ATTRIBUTION.md``. The sources are pydeface 2.1.0's ``data/mean_reg2mean.nii.gz``
and ``data/facemask.nii.gz`` (MIT licence). Get them with::

    pip download --no-deps pydeface==2.1.0 && unzip pydeface-2.1.0-*.whl -d pydeface

and run::

    python Training/make_deface_template.py --pydeface-data pydeface/pydeface/data
"""
import argparse
from pathlib import Path

import numpy as np

from AnonMRILib.models.model_card import sha256_of

REPO = Path(__file__).resolve().parents[1]
OUTPUT_DIR = REPO / "AnonMRILib" / "data" / "templates"
TEMPLATE_FILE = "deface_template_T1w.nii.gz"
FACEMASK_FILE = "deface_template_facemask.nii.gz"

ATTRIBUTION = """# DEFACE template: attribution

`deface_template_T1w.nii.gz` and `deface_template_facemask.nii.gz` are derived from
**pydeface 2.1.0** (https://github.com/poldracklab/pydeface, PyPI `pydeface`), files
`pydeface/data/mean_reg2mean.nii.gz` (an average head) and `pydeface/data/facemask.nii.gz`
(its face mask). pydeface is distributed under the MIT licence, reproduced below.

Processing (`Training/make_deface_template.py`): both resampled onto one 2 mm isotropic grid with
the template's orientation, cropped to the head plus {margin:.0f} mm; the head smoothed
(Gaussian, sigma 0.8 mm) before resampling and stored as uint8 (99.9th percentile = 255); the
face mask resampled linearly, thresholded at 0.5 and inverted so that 1 = face (to be removed).

Source SHA-256:
- mean_reg2mean.nii.gz: `{sha_template}`
- facemask.nii.gz: `{sha_mask}`

## pydeface licence (MIT)

{licence}
"""

MIT_LICENCE = """The MIT License (MIT)

Copyright (c) 2015

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pydeface-data", type=Path, required=True,
                        help="pydeface's data folder (holds mean_reg2mean.nii.gz and facemask.nii.gz)")
    parser.add_argument("--spacing-mm", type=float, default=2.0)
    parser.add_argument("--margin-mm", type=float, default=6.0)
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args()

    import SimpleITK as sitk

    from AnonMRILib.io import Volume, load_volume, save_volume
    from AnonMRILib.io.readers import simpleitk_to_numpy
    from AnonMRILib.io.writers import numpy_to_simpleitk

    template_path = args.pydeface_data / "mean_reg2mean.nii.gz"
    mask_path = args.pydeface_data / "facemask.nii.gz"
    template = load_volume(template_path)
    keep_mask = load_volume(mask_path)

    source = numpy_to_simpleitk(template.array.astype(np.float32), template.affine)
    source = sitk.SmoothingRecursiveGaussian(source, 0.8)
    mask_image = numpy_to_simpleitk(keep_mask.array.astype(np.float32), keep_mask.affine)

    # head bounding box (voxels above 5 % of the robust maximum) plus the margin, in template voxels
    data = template.array.astype(np.float32)
    high = float(np.percentile(data, 99.9))
    head = np.argwhere(data > 0.05 * high)
    margin_vox = np.ceil(args.margin_mm / template.spacing).astype(int)
    low_index = np.maximum(head.min(axis=0) - margin_vox, 0)
    high_index = np.minimum(head.max(axis=0) + margin_vox, np.array(template.shape) - 1)
    extent_mm = (high_index - low_index) * template.spacing
    size = [int(np.ceil(e / args.spacing_mm)) + 1 for e in extent_mm]
    origin = source.TransformContinuousIndexToPhysicalPoint([float(v) for v in low_index])

    reference = sitk.Image(size, sitk.sitkFloat32)
    reference.SetSpacing([args.spacing_mm] * 3)
    reference.SetDirection(source.GetDirection())
    reference.SetOrigin(origin)
    small = sitk.Resample(source, reference, sitk.Transform(), sitk.sitkLinear, 0.0)
    small_mask = sitk.Resample(mask_image, reference, sitk.Transform(), sitk.sitkLinear, 1.0)

    array, affine = simpleitk_to_numpy(small)
    scaled = np.clip(np.rint(array / high * 255.0), 0, 255).astype(np.uint8)
    mask_array, _ = simpleitk_to_numpy(small_mask)
    face = (mask_array < 0.5).astype(np.uint8)

    args.output_dir.mkdir(parents=True, exist_ok=True)
    save_volume(Volume(scaled, affine), args.output_dir / TEMPLATE_FILE)
    save_volume(Volume(face, affine), args.output_dir / FACEMASK_FILE)
    (args.output_dir / "ATTRIBUTION.md").write_text(ATTRIBUTION.format(
        margin=args.margin_mm, sha_template=sha256_of(template_path), sha_mask=sha256_of(mask_path),
        licence=MIT_LICENCE), encoding="utf-8")
    sizes = {name: (args.output_dir / name).stat().st_size for name in (TEMPLATE_FILE, FACEMASK_FILE)}
    print(f"template grid {scaled.shape} at {args.spacing_mm} mm; face voxels {int(face.sum())}; "
          + ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in sizes.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
