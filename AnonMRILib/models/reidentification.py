"""Re-identification attacker: the Siamese network of the CP-GAN paper, section 4.2.

S(x, y) = ||S~(x) - S~(y)||_2 where the embedding network S~ is a stack of convolution blocks,
a flatten and one fully connected layer (the paper gives only "conv. block / flatten /
fully-connected layer"; the sizes below are our choice, small enough to train on a CPU):

* input: one grey face rendering, ``image_size`` x ``image_size`` (default 64, small enough to
  train on a shared CPU in minutes; 128 works too), values in [0, 1]
  (``AnonMRILib.rendering.render_face`` output resized to the model's size, antialiased);
* ``len(channels)`` blocks of [``convs_per_block`` x (3x3 conv, batch norm, ReLU), 2x2 max-pool];
* flatten, fully connected layer to ``embedding_dim`` values (no normalisation: the triplet margin
  of 5 is in the units of this Euclidean space, as in the paper).

Weights ship as safetensors with a JSON model card beside them
(``<name>.safetensors`` + ``<name>.json``: config, training data, metrics, SHA-256 of the weights).
Loading never unpickles.
"""
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from ..errors import InputError, WeightsError
from .model_card import sha256_of

#: the shipped attacker's name in the weights folder (trained by ``Training/evaluate_privacy.py`` on
#: ORIGINAL renderings)
WEIGHTS_NAME = "reid_siamese.safetensors"
#: where the shipped attacker sits in the installed package (see :func:`default_weights_file`)
DEFAULT_WEIGHTS = Path(__file__).resolve().parents[1] / "weights" / WEIGHTS_NAME


def default_weights_file() -> Path:
    """The shipped attacker weights, through :func:`AnonMRILib.weights_store.resolve_weights_file`."""
    from ..weights_store import resolve_weights_file

    return resolve_weights_file(WEIGHTS_NAME, what="re-identification attacker weights")


@dataclass(frozen=True)
class SiameseConfig:
    """Architecture of the embedding network S~ (see module doc)."""

    image_size: int = 64
    channels: Tuple[int, ...] = (16, 32, 64, 64)
    embedding_dim: int = 64
    convs_per_block: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        if self.image_size % (2 ** len(self.channels)) != 0:
            raise InputError(f"image_size {self.image_size} must be divisible by 2**{len(self.channels)} "
                             f"(one 2x2 pooling per block)")
        if self.embedding_dim < 1 or not self.channels or min(self.channels) < 1 or self.convs_per_block < 1:
            raise InputError("embedding_dim, convs_per_block and every channel count must be positive")

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "SiameseConfig":
        known = {k: values[k] for k in ("image_size", "channels", "embedding_dim", "convs_per_block")
                 if k in values}
        return cls(**known)


def build_embedding_network(config: SiameseConfig):
    """The embedding network S~ as a ``torch.nn.Module`` mapping (N, 1, s, s) to (N, embedding_dim)."""
    import torch.nn as nn

    layers = []
    in_channels = 1
    for out_channels in config.channels:
        for _ in range(config.convs_per_block):
            layers += [nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
                       nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)]
            in_channels = out_channels
        layers.append(nn.MaxPool2d(2))
    side = config.image_size // (2 ** len(config.channels))
    layers += [nn.Flatten(), nn.Linear(in_channels * side * side, config.embedding_dim)]
    return nn.Sequential(*layers)


class SiameseNetwork:
    """S(x, y) = ||S~(x) - S~(y)||_2 around a torch embedding network (see module doc).

    ``module`` is the ``torch.nn.Module`` S~; ``embed`` and ``distance`` run it in eval mode
    without gradients on ``device``.
    """

    def __init__(self, config: Optional[SiameseConfig] = None, module=None, device: str = "cpu") -> None:
        from ..device import resolve_device

        self.config = config or SiameseConfig()
        self.device = resolve_device(device)
        self.module = (module if module is not None else build_embedding_network(self.config)).to(self.device)
        #: the model card when loaded from weights (:meth:`load`), else empty
        self.card: Dict[str, Any] = {}

    def prepare(self, renderings: np.ndarray):
        """(N, H, W) or (H, W) renderings in [0, 1] -> float tensor (N, 1, s, s) on the device.

        Renderings of another size are resized with bilinear interpolation (antialiased).
        """
        import torch
        import torch.nn.functional as F

        array = np.asarray(renderings, dtype=np.float32)
        if array.ndim == 2:
            array = array[None]
        if array.ndim != 3:
            raise InputError(f"renderings must be (N, H, W) or (H, W), got shape {array.shape}")
        if not np.all(np.isfinite(array)):
            raise InputError("renderings contain NaN or infinite values")
        tensor = torch.from_numpy(np.ascontiguousarray(array))[:, None].to(self.device)
        size = self.config.image_size
        if tensor.shape[-2:] != (size, size):
            tensor = F.interpolate(tensor, size=(size, size), mode="bilinear", align_corners=False,
                                   antialias=True)
        return tensor

    def embed(self, renderings: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """Embeddings S~(x), float64 (N, embedding_dim), of (N, H, W) renderings in [0, 1]."""
        import torch

        tensor = self.prepare(renderings)
        self.module.eval()
        outputs = []
        with torch.no_grad():
            for start in range(0, tensor.shape[0], batch_size):
                outputs.append(self.module(tensor[start:start + batch_size]).double().cpu().numpy())
        return np.concatenate(outputs, axis=0) if outputs else np.zeros((0, self.config.embedding_dim))

    def distance(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """S(x, y) for renderings ``x`` and ``y`` of the same count (or one against many)."""
        ex, ey = self.embed(x), self.embed(y)
        return np.linalg.norm(ex - ey, axis=1)

    # --- weights ----------------------------------------------------------------------------
    def save(self, path: Union[str, Path], card: Optional[Dict[str, Any]] = None) -> Path:
        """Write ``path`` (.safetensors) and the model card ``path`` with suffix .json."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.module.state_dict().items()}
        tmp = path.with_name(path.name + ".tmp")
        save_file(state, str(tmp), metadata={"model": "AnonMRI re-identification Siamese network"})
        tmp.replace(path)
        document = {"model": "reid_siamese", "architecture": "AnonMRILib.models.reidentification",
                    "config": asdict(self.config)}
        document.update(card or {})
        document["sha256"] = sha256_of(path)
        path.with_suffix(".json").write_text(json.dumps(document, indent=2, default=_json_default) + "\n")
        return path

    @classmethod
    def load(cls, path: Optional[Union[str, Path]] = None, device: str = "cpu") -> "SiameseNetwork":
        """Load weights and card written by :meth:`save`; checks the card's SHA-256.

        ``path`` None: the shipped attacker (:func:`default_weights_file`, with the shipped card).
        """
        from safetensors.torch import load_file

        if path is None:
            from ..weights_store import resolve_weights_file

            path = default_weights_file()
            card_path = resolve_weights_file(Path(WEIGHTS_NAME).with_suffix(".json").as_posix(),
                                             what="re-identification attacker model card")
        else:
            path = Path(path)
            card_path = path.with_suffix(".json")
        if not path.is_file() or not card_path.is_file():
            raise WeightsError(f"attacker weights not found: {path} (and its .json card); "
                               f"train them with Training/evaluate_privacy.py")
        card = json.loads(card_path.read_text())
        if card.get("sha256") and card["sha256"] != sha256_of(path):
            raise WeightsError(f"attacker weights {path} do not match the SHA-256 in their card")
        config = SiameseConfig.from_dict(card.get("config", {}))
        network = cls(config, device=device)
        try:
            network.module.load_state_dict(load_file(str(path), device="cpu"))
        except RuntimeError as error:
            raise WeightsError(f"attacker weights {path} do not fit the configuration in their card: "
                               f"{str(error).splitlines()[0]}") from None
        network.module.to(network.device).eval()
        network.card = card
        return network


def triplet_loss(margin: float = 5.0):
    """The triplet margin loss of Balntas et al. (torch.nn.TripletMarginLoss, L2), margin 5."""
    import torch.nn as nn

    return nn.TripletMarginLoss(margin=margin, p=2.0)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)
