"""Make the extension's before/after screenshot with Slicer's own volume rendering (no Slicer GUI).

The embedded sample head and its de-identified version, volume-rendered with the module's face
preset through ``vtkSlicerVolumeRenderingLogic`` on an offscreen 3D view (Kitware's ``slicer-core``
wheel), from the front and from the left::

    pip install -e ".[test]"          # slicer-core
    python docs/make_slicer_figure.py --method remodel --out docs/slicer-before-after.png

``--method``: ``remodel`` (CP-GAN, the shipped weights), or a removal baseline (``quickshear``, ...).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "AnonMRI")]


def render_views(scene, application_logic, volume_rendering_logic, node, views, size):
    from AnonMRIModuleLib import render3d

    return [render3d.render_face_offscreen(scene, application_logic, volume_rendering_logic, node, view=view,
                                           size=size) for view in views]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="remodel", help="remodel, or a removal baseline name")
    parser.add_argument("--out", default=str(ROOT / "docs" / "slicer-before-after.png"))
    parser.add_argument("--size", type=int, default=320, help="pixels per panel")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)

    import slicer
    from PIL import Image, ImageDraw

    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head
    from AnonMRIModuleLib import core, mrml, render3d

    scene = slicer.vtkMRMLScene()
    application_logic, volume_rendering_logic = render3d.attach_volume_rendering_logic(scene)

    head = mrml.add_volume_node(scene, load_sample_head(), "sample head")
    brain = mrml.add_volume_node(scene, load_sample_brain_mask(), "sample brain", labelmap=True)
    logic = core.AnonMRILogicCore(scene)
    if args.method in ("remodel", core.REMODEL_LABEL):
        output = logic.remodelFace(head, brain, device=args.device, seed=0)
    else:
        output = logic.deface(head, args.method, brain)
    views = ("anterior", "left")
    before = render_views(scene, application_logic, volume_rendering_logic, head, views, args.size)
    after = render_views(scene, application_logic, volume_rendering_logic, output, views, args.size)
    grid = np.concatenate([np.concatenate(before, axis=0), np.concatenate(after, axis=0)], axis=1)
    image = Image.fromarray(grid)
    draw = ImageDraw.Draw(image)
    method_name = core.short_method_name(*core.parse_method_label(
        core.REMODEL_LABEL if args.method == "remodel" else args.method))
    for column, title in enumerate(("input", f"output ({method_name})")):
        draw.text((column * args.size + 8, 6), title, fill=(255, 255, 255))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, format="PNG", optimize=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
