"""``anonmri info FILE``: shape, voxel type, spacing, orientation and intensity range of an image."""
import argparse
import json

import numpy as np

from .common import add_input_argument, add_quiet_argument, add_series_uid_argument, load_volume


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("info", help="describe an image (geometry and intensities)")
    add_input_argument(parser)
    add_series_uid_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_quiet_argument(parser)  # accepted as by every command; the summary is what info prints
    parser.set_defaults(func=run)


def describe(volume) -> dict:
    """Geometry and intensity summary of a Volume (no header text: there is none to show)."""
    import nibabel as nib

    data = volume.array
    finite = np.isfinite(data) if np.issubdtype(data.dtype, np.floating) else np.ones(data.shape, bool)
    values = data[finite]
    return {
        "shape": list(volume.shape),
        "dtype": str(volume.dtype),
        "spacing_mm": [round(float(s), 6) for s in volume.spacing],
        "orientation": "".join(nib.aff2axcodes(volume.affine)),
        "origin_ras_mm": [round(float(o), 4) for o in volume.origin],
        "field_of_view_mm": [round(float(n * s), 3) for n, s in zip(volume.shape, volume.spacing)],
        "intensity_min": float(values.min()) if values.size else None,
        "intensity_max": float(values.max()) if values.size else None,
        "nonfinite_voxels": int((~finite).sum()),
        "nonzero_fraction": float(np.count_nonzero(data) / data.size),
    }


def run(args: argparse.Namespace) -> int:
    volume = load_volume(args.input, series_uid=args.series_uid)
    summary = describe(volume)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:18s} {value}")
    return 0
