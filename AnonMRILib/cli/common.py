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
    parser.add_argument("--quiet", action="store_true", help="no progress bar or messages")


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


def add_slice_thickness_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--slice-thickness MM``: the input's slice thickness when it differs from the spacing."""
    parser.add_argument("--slice-thickness", type=float, default=None, metavar="MM",
                        help=f"thickness of the input's slices when it differs from their spacing (a 5 mm slice every "
                             f"6.5 mm: 5); {what} (default: a DICOM input's SliceThickness, else the BIDS sidecar's "
                             "beside the input, else the spacing)")


def slice_thickness_of(args: argparse.Namespace) -> Optional[float]:
    """``--slice-thickness``, else a DICOM series' ``SliceThickness``, else the BIDS sidecar's
    beside the input, else None (the spacing)."""
    from ..io.readers import dicom_slice_thickness
    from ..io.sidecar import sidecar_slice_thickness

    if args.slice_thickness is not None:
        return float(args.slice_thickness)
    if Path(args.input).is_dir():
        return dicom_slice_thickness(args.input, getattr(args, "series_uid", None))
    return sidecar_slice_thickness(args.input)


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


def checked_brain_mask(args: argparse.Namespace, image: Volume, progress=None,
                       device: str = "auto") -> Optional[Volume]:
    """The user's ``--brain-mask`` (checked), or with plausibility checks on (or ``--apply-to`` given) the
    computed mask, checked before any work uses it; None (the pipeline computes it) otherwise."""
    mask = load_user_brain_mask(args, image)
    if mask is not None or not (plausibility_checks_on(args) or getattr(args, "apply_to", None)):
        return mask
    from AnonMRILib.transforms.brain_mask import brain_mask
    from AnonMRILib.transforms.plausibility import check_brain_mask

    mask = brain_mask(image, progress=progress, device=device)
    if plausibility_checks_on(args):
        check_brain_mask(image, mask)
    return mask


def add_apply_to_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apply-to", nargs=2, action="append", default=[], metavar=("IMAGE", "OUT"),
                        help="another contrast of the same session (T2w, FLAIR, PD; NIfTI, ...) that receives the same "
                             "face through a rigid registration to IN, keeping its own brain voxels; repeatable")


def load_other_contrasts(args: argparse.Namespace, inputs) -> list:
    """The ``--apply-to`` images, loaded and checked (and their output paths) before any work:
    [(Volume, IMAGE, OUT)]."""
    from AnonMRILib.errors import InputError
    from AnonMRILib.io import check_output_path, require_usable_image

    pairs = [(Path(image), Path(out)) for image, out in getattr(args, "apply_to", None) or []]
    outs = [Path(args.output).resolve()] + [out.resolve() for _, out in pairs]
    if len(set(outs)) != len(outs):
        raise InputError("--apply-to outputs must differ from each other and from OUT")
    protect = [p for p in inputs if p is not None] + [image for image, _ in pairs]
    loaded = []
    for image, out in pairs:
        check_output_path(out, protect)
        volume = load_volume(image)
        require_usable_image(volume, what=f"image {image}")
        if plausibility_checks_on(args):
            from AnonMRILib.transforms.plausibility import check_head_present

            check_head_present(volume)
        loaded.append((volume, image, out))
    return loaded


def stage_other_contrasts(outputs, args: argparse.Namespace, others: list, reference: Volume, reference_out: Volume,
                          brain: Volume, method: str, inputs) -> None:
    """Carry ``reference_out``'s face to each ``--apply-to`` image and stage its output (and sidecar)."""
    from AnonMRILib.pipelines.multicontrast import carry_face

    protect = [p for p in inputs if p is not None] + [image for _, image, _ in others]
    for other, image, out in others:
        carried = carry_face(reference, reference_out, brain, other)
        outputs.add_volume(carried, out, like=other, protect=protect)
        if getattr(args, "bids_sidecar", False):
            from AnonMRILib.io.sidecar import sidecar_path, write_deidentified_sidecar

            outputs.add_file(sidecar_path(out), lambda path, image=image: write_deidentified_sidecar(
                path, method, source_image=image), protect=protect)


def stage_bids_sidecar(outputs, args: argparse.Namespace, output: Path, method: str, codes=()) -> None:
    """With ``--bids-sidecar``, stage ``<output stem>.json`` in the :class:`OutputTransaction` ``outputs``."""
    if not getattr(args, "bids_sidecar", False):
        return
    from AnonMRILib.io.sidecar import sidecar_path, write_deidentified_sidecar

    source = getattr(args, "input", None)
    outputs.add_file(sidecar_path(output), lambda path: write_deidentified_sidecar(
        path, method, codes=codes, source_image=source), protect=[source])


def add_dicom_output_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "DICOM output", "when IN is a DICOM series folder and OUT a folder name without an image suffix (or "
        "--output-format dicom), OUT is written as a DICOM series de-identified under DICOM PS3.15's Basic Profile "
        "with the Clean Recognizable Visual Features option")
    group.add_argument("--output-format", choices=("auto", "dicom", "image"), default="auto",
                       help="auto (default): DICOM when IN is a DICOM folder and OUT has no image suffix")
    group.add_argument("--pseudonym", default=None, help="Patient's Name / Patient ID of the DICOM output "
                       "(default: derived from --uid-key and the original ID, else random)")
    group.add_argument("--uid-key", type=Path, default=None, metavar="FILE",
                       help="secret key file of the UID mapping: the same key gives the same new UIDs, so the "
                            "series of one study stay one study (default: a random key per run)")
    group.add_argument("--new-uid-key", type=Path, default=None, metavar="FILE",
                       help="create a new key file (owner-readable only) and use it; keep it to process further "
                            "series of the same studies")


def dicom_output_requested(args: argparse.Namespace) -> bool:
    """True when the command writes a DICOM series folder (see :func:`add_dicom_output_arguments`)."""
    from AnonMRILib.io import image_suffix

    mode = getattr(args, "output_format", "image")
    if mode == "dicom":
        return True
    return mode == "auto" and Path(args.input).is_dir() and not image_suffix(args.output)


def check_image_output(args: argparse.Namespace, inputs) -> None:
    """Validate OUT before any work: an image file path, or for DICOM output an absent or empty folder and an
    input series that can be written back."""
    from AnonMRILib.errors import InputError
    from AnonMRILib.io import check_output_path

    inputs = [p for p in inputs if p is not None]
    if not dicom_output_requested(args):
        if getattr(args, "pseudonym", None) or getattr(args, "uid_key", None) or getattr(args, "new_uid_key", None):
            raise InputError("--pseudonym/--uid-key/--new-uid-key apply to DICOM output only "
                             "(a DICOM folder in, a folder out)")
        check_output_path(args.output, inputs)
        return
    from AnonMRILib.io.dicom_writer import DicomDeidentificationConfig, check_dicom_output

    output = Path(args.output)
    if not Path(args.input).is_dir():
        raise InputError("DICOM output needs a DICOM series folder as input")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise InputError(f"{output}: the DICOM output folder exists and is not empty")
    if any(Path(p).resolve() == output.resolve() for p in inputs):
        raise InputError(f"{output}: refusing to write into the input folder")
    if args.uid_key is not None and args.new_uid_key is not None:
        raise InputError("give --uid-key or --new-uid-key, not both")
    DicomDeidentificationConfig(pseudonym=args.pseudonym)  # checks the pseudonym
    check_dicom_output(args.input, getattr(args, "series_uid", None))


def stage_image_output(outputs, args: argparse.Namespace, volume: Volume, like: Volume, method: str, inputs) -> None:
    """Stage OUT in ``outputs``: the volume as an image file, or as a de-identified DICOM series folder."""
    inputs = [p for p in inputs if p is not None]
    if not dicom_output_requested(args):
        outputs.add_volume(volume, args.output, like=like, protect=inputs)
        stage_bids_sidecar(outputs, args, args.output, method)
        return
    from AnonMRILib.io.dicom_writer import DicomDeidentificationConfig, new_uid_key, read_uid_key, write_dicom_series

    key = None
    if args.new_uid_key is not None:
        key = read_uid_key(new_uid_key(args.new_uid_key))
    elif args.uid_key is not None:
        key = read_uid_key(args.uid_key)
    config = DicomDeidentificationConfig(method=method, pseudonym=args.pseudonym, uid_key=key)
    outputs.add_folder(args.output, lambda folder: write_dicom_series(
        volume, args.input, folder, config, series_uid=getattr(args, "series_uid", None)))
