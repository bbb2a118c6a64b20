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


def add_plausibility_argument(parser: argparse.ArgumentParser) -> None:
    """``--skip-plausibility-checks``: a command that has it checks its inputs with
    :mod:`AnonMRILib.transforms.plausibility` (in :func:`load_input`, :func:`load_user_brain_mask`, ...)."""
    parser.add_argument("--skip-plausibility-checks", action="store_true",
                        help="accept inputs that do not look like a head MRI (noise, inverted contrast, voxel sizes "
                             "outside 0.1-10 mm, implausible brain or lesion masks); for those who know better")


def add_bids_sidecar_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bids-sidecar", action="store_true",
                        help="also write <output stem>.json with the BIDS keys DeidentificationMethod and "
                             "DeidentificationMethodCodeSequence (plus the input sidecar's non-identifying keys)")


def plausibility_checks_on(args: argparse.Namespace) -> bool:
    """True for a command that offers ``--skip-plausibility-checks`` and was not given it."""
    return hasattr(args, "skip_plausibility_checks") and not args.skip_plausibility_checks


def load_input(args: argparse.Namespace, attribute: str = "input") -> Volume:
    """Load the image named by ``args.<attribute>``; refuse NaN/Inf or constant images and, for a command
    with plausibility checks, images without a plausible head."""
    from AnonMRILib.io import require_usable_image

    volume = load_volume(getattr(args, attribute), series_uid=getattr(args, "series_uid", None))
    require_usable_image(volume, what=f"image {getattr(args, attribute)}")
    if plausibility_checks_on(args):
        from AnonMRILib.transforms.plausibility import check_head_present

        check_head_present(volume)
    return volume


def load_user_brain_mask(args: argparse.Namespace, image: Volume) -> Optional[Volume]:
    """The ``--brain-mask`` volume checked against ``image``'s grid (and for plausibility), or None."""
    if getattr(args, "brain_mask", None) is None:
        return None
    from AnonMRILib.transforms.brain_mask import user_brain_mask

    mask = user_brain_mask(load_volume(args.brain_mask), image)
    if plausibility_checks_on(args):
        from AnonMRILib.transforms.plausibility import check_brain_mask

        check_brain_mask(image, mask)
    return mask


def checked_brain_mask(args: argparse.Namespace, image: Volume, progress=None, device: str = "auto") -> Optional[Volume]:
    """The user's ``--brain-mask`` (checked), or with plausibility checks on the computed mask, checked
    before any work uses it; None (the pipeline computes it) when neither applies."""
    mask = load_user_brain_mask(args, image)
    if mask is not None or not plausibility_checks_on(args):
        return mask
    from AnonMRILib.transforms.brain_mask import brain_mask
    from AnonMRILib.transforms.plausibility import check_brain_mask

    mask = brain_mask(image, progress=progress, device=device)
    check_brain_mask(image, mask)
    return mask


def stage_bids_sidecar(outputs, args: argparse.Namespace, output: Path, method: str, codes=()) -> None:
    """With ``--bids-sidecar``, stage ``<output stem>.json`` in the :class:`OutputTransaction` ``outputs``."""
    if not getattr(args, "bids_sidecar", False):
        return
    from AnonMRILib.io.sidecar import sidecar_path, write_deidentified_sidecar

    source = getattr(args, "input", None)
    outputs.add_file(sidecar_path(output), lambda path: write_deidentified_sidecar(
        path, method, codes=codes, source_image=source), protect=[source])
