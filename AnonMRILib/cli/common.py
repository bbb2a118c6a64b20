"""Arguments and helpers shared by several sub-commands."""
import argparse
from pathlib import Path
from typing import Optional

from AnonMRILib.io import Volume, load_volume


def add_input_argument(parser: argparse.ArgumentParser, name: str = "input",
                       help: str = "input image (NIfTI, NRRD, MHA/MHD, MGZ) or DICOM series folder") -> None:
    parser.add_argument(name, type=Path, help=help)


def add_series_uid_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--series-uid", default=None,
                        help="DICOM SeriesInstanceUID to read from a folder with several series "
                             "(default: the largest)")


def add_brain_mask_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--brain-mask", type=Path, default=None, metavar="MASK",
                        help="your own brain mask (nonzero = brain) on the input's grid, "
                             "instead of computing one")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where networks run (default: CUDA when available)")


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def load_input(args: argparse.Namespace, attribute: str = "input") -> Volume:
    """Load the image named by ``args.<attribute>`` and refuse NaN/Inf or constant images."""
    from AnonMRILib.io import require_usable_image

    volume = load_volume(getattr(args, attribute), series_uid=getattr(args, "series_uid", None))
    require_usable_image(volume, what=f"image {getattr(args, attribute)}")
    return volume


def load_user_brain_mask(args: argparse.Namespace, image: Volume) -> Optional[Volume]:
    """The ``--brain-mask`` volume checked against ``image``'s grid, or None when not given."""
    if getattr(args, "brain_mask", None) is None:
        return None
    from AnonMRILib.transforms.brain_mask import user_brain_mask

    return user_brain_mask(load_volume(args.brain_mask), image)
