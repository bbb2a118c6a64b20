"""Safetensors weights of the lesion-preserving models: save, load, locate (never unpickled).

A weights file holds the model's ``state_dict`` and string metadata: ``kind`` (``lesion_vae`` or
``lesion_diffusion``), ``config`` (JSON of the config dataclass) and, for the diffusion model,
``latent_scale`` / ``latent_shift`` (the background latent is diffused as
``(mean - latent_shift) / latent_scale``). The shipped files live in ``AnonMRILib/weights/`` as
``lesion_vae.safetensors`` and ``lesion_diffusion.safetensors`` with JSON model cards beside them.
"""
import json
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

from ..errors import WeightsError
from .model_card import sha256_of  # noqa: F401  (re-exported for the training scripts)

VAE_FILE = "lesion_vae.safetensors"
DIFFUSION_FILE = "lesion_diffusion.safetensors"
#: the shipped models of the donor-brain prior's learned variation (240 x 240, prior-conditioned
#: diffusion) live in this sub-folder of the weights folder, under the same two file names
PRIOR_FOLDER = "lesion_prior"
PathLike = Union[str, Path]


def default_weights_dir() -> Path:
    """The package's ``weights`` folder (the shipped files may also come from elsewhere: :func:`resolve_weights`)."""
    return Path(__file__).resolve().parents[1] / "weights"


def save_model(path: PathLike, model, kind: str, extra: Optional[Dict[str, str]] = None) -> None:
    """Write ``model.state_dict()`` and metadata (kind, config JSON, ``extra``) atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    metadata = {"kind": kind, "config": json.dumps(model.config.to_dict())}
    metadata.update({key: str(value) for key, value in (extra or {}).items()})
    temporary = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temporary), metadata=metadata)
    temporary.replace(path)


def _read(path: PathLike, kind: str):
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as error:  # safetensors raises several types for broken files
        raise WeightsError(f"{path} is not a readable safetensors file ({error})") from None
    if metadata.get("kind") != kind:
        raise WeightsError(f"{path} holds {metadata.get('kind')!r} weights, expected {kind!r}")
    return tensors, metadata


def _load_state(model, tensors, path) -> None:
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        raise WeightsError(f"{path} does not match the model architecture: {str(error).splitlines()[0]}") from None


def load_lesion_vae(path: PathLike, device="cpu"):
    """A :class:`LesionPreservingAutoencoder` in eval mode from a ``lesion_vae`` weights file."""
    from .lesion_vae import LesionPreservingAutoencoder, LesionVAEConfig

    tensors, metadata = _read(path, "lesion_vae")
    model = LesionPreservingAutoencoder(LesionVAEConfig.from_dict(json.loads(metadata["config"])))
    _load_state(model, tensors, path)
    return model.to(device).eval()


def load_lesion_diffusion(path: PathLike, device="cpu") -> Tuple[object, float, float]:
    """(:class:`ConditionalLatentUNet` in eval mode, latent_scale, latent_shift) from a weights file."""
    from .latent_diffusion import ConditionalLatentUNet, LatentDiffusionConfig

    tensors, metadata = _read(path, "lesion_diffusion")
    model = ConditionalLatentUNet(LatentDiffusionConfig.from_dict(json.loads(metadata["config"])))
    _load_state(model, tensors, path)
    return model.to(device).eval(), float(metadata.get("latent_scale", 1.0)), float(metadata.get("latent_shift", 0.0))


def resolve_weights(weights: Optional[PathLike], prior: bool = False) -> Tuple[Path, Path]:
    """(VAE file, diffusion file) from a folder holding both, or the shipped weights when None
    (``prior``: the donor-brain prior's models, :data:`PRIOR_FOLDER`; else the paper generator's).

    The shipped files are found by :func:`AnonMRILib.weights_store.resolve_weights_file` (package,
    ``$ANONMRI_WEIGHTS_DIR``, user cache, download), each verified against the manifest.
    """
    if weights is None:
        from ..weights_store import resolve_weights_file

        prefix, what = (PRIOR_FOLDER + "/", "lesion prior ") if prior else ("", "lesion ")
        return (resolve_weights_file(prefix + VAE_FILE, what=what + "VAE weights"),
                resolve_weights_file(prefix + DIFFUSION_FILE, what=what + "diffusion weights"))
    folder = Path(weights)
    if not folder.is_dir():
        raise WeightsError(f"weights folder {folder} does not exist (it must hold {VAE_FILE} and {DIFFUSION_FILE})")
    vae, diffusion = folder / VAE_FILE, folder / DIFFUSION_FILE
    for path in (vae, diffusion):
        if not path.is_file():
            raise WeightsError(f"{path} is missing; train with Training/train_lesion_vae.py and "
                               "Training/train_lesion_diffusion.py or pass --weights FOLDER")
    return vae, diffusion
