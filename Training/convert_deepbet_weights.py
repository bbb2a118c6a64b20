#!/usr/bin/env python
"""Convert deepbet's TorchScript brain-extraction networks into AnonMRI's safetensors weights.

deepbet 1.0.2 (https://github.com/wwu-mmll/deepbet, MIT licence, Copyright (c) 2023 Medical
Machine Learning Lab - University of Münster) ships two TorchScript networks: ``bbox_model.pt``
(finds the brain's bounding box on a 128^3 view of the head) and ``model.pt`` (segments the brain
inside that box at 256^3). Both are the LinkNet3d of :mod:`AnonMRILib.models.linknet3d`. This
script copies their tensors into that plain module, checks on random inputs that the module
reproduces the TorchScript output, and writes ``deepbet_bbox.safetensors``,
``deepbet_brain.safetensors``, the model card ``deepbet.json`` (config, source, licence, SHA-256
of each file) and ``LICENSE-deepbet.txt`` into ``AnonMRILib/weights/brain_extraction/``.

Get the wheel and run it (once; the converted files are committed)::

    pip download --no-deps deepbet==1.0.2 -d wheels
    python Training/convert_deepbet_weights.py wheels/deepbet-1.0.2-py3-none-any.whl

TorchScript is read here only, in this offline conversion; AnonMRI itself never loads it.
"""
import argparse
import hashlib
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.models.model_card import sha256_of  # noqa: E402
from AnonMRILib.models.linknet3d import LinkNet3d, LinkNet3dConfig  # noqa: E402

MEMBERS = {"bbox": "data/models/bbox_model.pt", "brain": "data/models/model.pt"}
LICENSE_MEMBER = "deepbet-1.0.2.dist-info/LICENSE"


def convert(scripted: torch.jit.ScriptModule, dtype: torch.dtype, seed: int = 0) -> dict:
    """State dict of a LinkNet3d equal to ``scripted``; checks outputs on random inputs."""
    module = LinkNet3d(LinkNet3dConfig()).eval()
    module.load_state_dict(scripted.state_dict(), strict=True)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        x = torch.randn(1, 1, 64, 64, 64, generator=generator)
        difference = (module(x) - scripted(x)).abs().max().item()
    if difference > 1e-4:
        raise SystemExit(f"the rebuilt LinkNet3d differs from the TorchScript network by {difference:g}")
    print(f"  rebuilt module matches TorchScript (max |difference| {difference:.2e})")
    return {name: tensor.detach().to(dtype).contiguous() for name, tensor in module.state_dict().items()}


def main() -> int:
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path, help="deepbet-1.0.2-py3-none-any.whl")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "AnonMRILib" / "weights" / "brain_extraction")
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                        help="storage precision (inference always runs in float32)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    card = {
        "model": "deepbet-linknet3d",
        "config": LinkNet3dConfig().__dict__,
        "source": "deepbet 1.0.2 (PyPI wheel), https://github.com/wwu-mmll/deepbet",
        "paper": "Fisch L. et al., deepbet: Fast brain extraction of T1-weighted MRI using "
                 "Convolutional Neural Networks, Computers in Biology and Medicine 179 (2024) 108845",
        "licence": "MIT, Copyright (c) 2023 Medical Machine Learning Lab - University of Muenster "
                   "(LICENSE-deepbet.txt)",
        "training_data": "see the deepbet paper (T1-weighted images of healthy adults from public "
                         "datasets); not retrained by AnonMRI",
        "storage_dtype": args.dtype,
        "files": {},
    }
    with zipfile.ZipFile(args.wheel) as wheel:
        (args.out_dir / "LICENSE-deepbet.txt").write_bytes(wheel.read(LICENSE_MEMBER))
        for role, member in MEMBERS.items():
            print(f"{role}: {member}")
            with tempfile.TemporaryDirectory() as scratch:
                archive = Path(scratch) / "model.pt"
                archive.write_bytes(wheel.read(member))
                scripted = torch.jit.load(str(archive), map_location="cpu").eval()
            tensors = convert(scripted, dtype)
            path = args.out_dir / f"deepbet_{role}.safetensors"
            save_file(tensors, str(path), metadata={"model": "deepbet-linknet3d", "role": role})
            card["files"][role] = {"file": path.name, "sha256": sha256_of(path),
                                   "source_member": member,
                                   "source_sha256": hashlib.sha256(wheel.read(member)).hexdigest()}
            print(f"  wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    (args.out_dir / "deepbet.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out_dir / 'deepbet.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
