"""``anonmri render IN OUT.png``: a ray-cast face rendering (shaded skin surface) as a PNG.

``--view`` picks anterior (default), posterior, left, right, superior, inferior, or ``all`` for a
labelled row of the six; ``--azimuth``/``--elevation`` turn the viewer (degrees; see
:mod:`AnonMRILib.rendering.camera`). The skin iso-level is chosen from the image unless
``--iso-level`` gives one.
"""
import argparse
from pathlib import Path

from .common import add_device_argument, add_input_argument, add_quiet_argument, add_series_uid_argument, load_input


def add_parser(subparsers) -> None:
    from AnonMRILib.rendering.camera import VIEW_NAMES

    parser = subparsers.add_parser(
        "render", help="ray-cast a face rendering of a head image to PNG",
        description="Render the skin surface of a head image as a volume renderer shows it "
                    "(orthographic, upright in RAS whatever the voxel order) and write a PNG.")
    add_input_argument(parser)
    parser.add_argument("output", type=Path, help="output PNG file")
    add_series_uid_argument(parser)
    parser.add_argument("--view", choices=VIEW_NAMES + ("all",), default="anterior",
                        help="viewing side (default anterior; 'all' = the six views in a row)")
    parser.add_argument("--size", type=int, default=256, help="image size in pixels (default 256)")
    parser.add_argument("--azimuth", type=float, default=0.0, metavar="DEG",
                        help="turn the viewer about the superior axis (+ = towards the patient's left)")
    parser.add_argument("--elevation", type=float, default=0.0, metavar="DEG",
                        help="raise the viewer towards the view's up axis")
    parser.add_argument("--iso-level", type=float, default=None,
                        help="skin intensity threshold (default: chosen from the image)")
    add_device_argument(parser)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.rendering import check_png_path, make_camera, save_png, side_by_side
    from AnonMRILib.rendering.camera import VIEW_NAMES
    from AnonMRILib.rendering.raycast import SurfaceRenderer

    check_png_path(args.output, [args.input])
    volume = load_input(args)
    renderer = SurfaceRenderer(volume, iso_level=args.iso_level, device=args.device)
    views = VIEW_NAMES if args.view == "all" else (args.view,)
    images = [renderer.render(make_camera(view, args.azimuth, args.elevation), size=args.size).image
              for view in views]
    figure = side_by_side(images, list(views)) if len(images) > 1 else images[0]
    from AnonMRILib.io.writers import OutputTransaction

    with OutputTransaction() as outputs:  # creates the output folder when missing
        outputs.add_file(args.output, lambda path: save_png(figure, path), protect=[args.input])
    if not args.quiet:
        print(f"wrote {args.output}")
    return 0
