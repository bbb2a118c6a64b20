#!/usr/bin/env python
"""Ship the lesion method's 240 x 240 models (the donor prior's learned variation) from two training runs.

Takes ``lesion_vae.safetensors`` of a ``Training/train_lesion_vae.py`` run and
``lesion_diffusion.safetensors`` of a ``Training/train_lesion_diffusion.py`` run (prior-conditioned),
with their model cards, and writes ``AnonMRILib/weights/lesion_prior/`` (``--out``):

* both weights files, in float16 with ``--half`` (loaded back into float32 models; half the size in
  the repository), their cards with the new SHA-256 and size;
* into the VAE card, ``held_out_reconstruction_real``: whole-slice SSIM / PSNR of the joint
  reconstruction of every axial slice with brain of real scans that took part in nothing
  (``--real NAME=IMAGE:LABEL[:BRAIN_MASK]``; pyradiomics' brain1/brain2, skull-stripped with the
  given mask or an Otsu head mask's interior), each slice mapped to the 240 mm model field of view at
  1 mm as the pipeline does, intensities scaled as the pipeline does
  (:func:`AnonMRILib.pipelines.lesion_prior.training_window`).

Then ``python -m AnonMRILib.weights_store --write-manifest`` lists the new files in the manifest.

    python Training/export_lesion_prior_weights.py --vae runs/lesion/vae240 --diffusion runs/lesion/diffusion240 \\
        --half --real brain1=PYRAD/brain1_image.nrrd:PYRAD/brain1_label.nrrd
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def half_copy(source: Path, target: Path, half: bool) -> None:
    """``source`` safetensors with its metadata, floating tensors cast to float16 when ``half``, atomically."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt", device="cpu") as handle:
        metadata = handle.metadata() or {}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    if half:
        import torch

        tensors = {name: t.to(torch.float16) if t.is_floating_point() else t for name, t in tensors.items()}
        metadata = {**metadata, "stored_dtype": "float16"}
    temporary = target.with_name(target.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(temporary), metadata=metadata)
    temporary.replace(target)


def vae_reference(trained_with: dict, shipped: Path, half: bool) -> dict:
    """The diffusion card's ``vae`` entry for the exported pair: the shipped VAE file and its sha256,
    with the training VAE's sha256 (the file the latent statistics were measured with) kept apart."""
    from AnonMRILib.models.lesion_weights import sha256_of

    return {"file": shipped.name, "sha256": sha256_of(shipped),
            "trained_with_sha256": trained_with.get("trained_with_sha256", trained_with.get("sha256")),
            "note": "the shipped VAE is the training VAE" + (" stored in float16" if half else "")}


def real_reconstruction(vae, image_path: Path, label_path: Path, mask_path=None) -> dict:
    """Whole-slice SSIM/PSNR of the joint reconstruction of every brain slice of one real scan."""
    import torch

    from AnonMRILib.evaluation.image_metrics import summarize
    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.lesion import axial_layout, slices_to_model, to_ras_layout
    from AnonMRILib.pipelines.lesion_prior import training_window
    from AnonMRILib.transforms.brain_mask import brain_mask

    image = load_volume(image_path)
    lesion = np.asarray(load_volume(label_path).array) != 0
    mask = load_volume(mask_path) if mask_path else brain_mask(image)
    brain = (np.asarray(mask.array) != 0) | lesion
    order, flips = axial_layout(image.affine)
    data, lesion_r, brain_r = (to_ras_layout(np.asarray(a), order, flips) for a in (image.array, lesion, brain))
    spacing = np.asarray(image.spacing)[list(order)]
    low, high = training_window(np.asarray(data, np.float64)[brain_r])
    normalized = np.clip((np.where(brain_r, data, low) - low) / (high - low), 0.0, 1.0)
    present = np.flatnonzero(brain_r.any(axis=(0, 1)))
    box = np.argwhere(brain_r)
    center = (box.min(0) + box.max(0)) / 2.0
    size = vae.config.image_size
    images = np.clip(slices_to_model(np.moveaxis(normalized[:, :, present], -1, 0), spacing[:2], center[:2], size), 0, 1)
    masks = slices_to_model(np.moveaxis(lesion_r[:, :, present], -1, 0).astype(np.float32), spacing[:2], center[:2],
                            size) >= 0.5
    with torch.no_grad():
        x = torch.from_numpy(images.astype(np.float32))[:, None]
        m = torch.from_numpy(masks.astype(np.float32))[:, None]
        whole = torch.cat([vae.reconstruct(x[i:i + 16], m[i:i + 16])["whole_hat"] for i in range(0, len(x), 16)])
    metrics = summarize(images, whole[:, 0].clamp(0, 1).numpy())
    return {"slices": int(len(present)), **{k: round(float(v), 4) for k, v in metrics.items()}}


def main(argv=None) -> int:
    from AnonMRILib.models.lesion_weights import DIFFUSION_FILE, PRIOR_FOLDER, VAE_FILE, load_lesion_diffusion, \
        load_lesion_vae, sha256_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vae", type=Path, required=True, help="train_lesion_vae.py output folder")
    parser.add_argument("--diffusion", type=Path, required=True, help="train_lesion_diffusion.py output folder")
    parser.add_argument("--out", type=Path, default=REPO / "AnonMRILib" / "weights" / PRIOR_FOLDER)
    parser.add_argument("--half", action="store_true", help="store float16 tensors")
    parser.add_argument("--real", action="append", default=[], metavar="NAME=IMAGE:LABEL[:MASK]",
                        help="a real scan for the card's reconstruction figures (repeatable)")
    parser.add_argument("--vae-lineage", default=None,
                        help="text for the VAE card's training_lineage (earlier runs it was initialised from)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    diffusion, _, _ = load_lesion_diffusion(args.diffusion / DIFFUSION_FILE)
    if not diffusion.config.prior_channels:
        raise SystemExit("the diffusion model is not conditioned on the prior (train with --set prior_conditioned=true)")
    for folder, name in ((args.vae, VAE_FILE), (args.diffusion, DIFFUSION_FILE)):
        target = args.out / name
        half_copy(folder / name, target, args.half)
        card = json.loads((folder / name.replace(".safetensors", ".json")).read_text())
        card.update({"sha256": sha256_of(target), "size_bytes": target.stat().st_size,
                     "stored_dtype": "float16" if args.half else "float32",
                     "exported_by": "Training/export_lesion_prior_weights.py"})
        if name == VAE_FILE:
            vae = load_lesion_vae(target)
            real = {}
            for item in args.real:
                label, _, paths = item.partition("=")
                parts = paths.split(":")
                real[label] = real_reconstruction(vae, Path(parts[0]), Path(parts[1]), parts[2] if len(parts) > 2 else None)
                print(label, real[label], flush=True)
            if real:
                card["held_out_reconstruction_real"] = real
            if args.vae_lineage:
                card["training_lineage"] = args.vae_lineage
            card.pop("history", None) if len(json.dumps(card.get("history", []))) > 20000 else None
        elif isinstance(card.get("vae"), dict):  # the VAE the model was trained with, as shipped next to it
            card["vae"] = vae_reference(card["vae"], args.out / VAE_FILE, args.half)
        (args.out / name.replace(".safetensors", ".json")).write_text(json.dumps(card, indent=2) + "\n")
        print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
