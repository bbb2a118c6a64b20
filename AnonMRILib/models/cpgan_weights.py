"""CP-GAN generator weights: safetensors file + JSON model card, never pickle.

The card (``<name>.json`` beside ``<name>.safetensors``) holds at least::

    {"model": "cpgan-generator", "config": {...CPGANConfig...},
     "privacy_transform": {...PrivacyTransformConfig fields...},
     "sha256": "<hex digest of the .safetensors file>", ...training data, steps, losses...}

:func:`load_generator` checks that both files exist, that the SHA-256 matches the card, and that
the tensors fit the configuration; any failure is a :class:`~AnonMRILib.errors.WeightsError`
with one clear sentence.
"""
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from ..errors import WeightsError
from .model_card import sha256_of, verify_sha256

MODEL_NAME = "cpgan-generator"
#: the shipped generators by prior: ``average_head`` = CP-GAN on the anatomical prior (the face is
#: T(x) plus a learned residual, or warped by a learned diffeomorphism), ``none`` = the paper's
#: generator (the face from gamma alone)
SHIPPED_WEIGHTS: Dict[str, str] = {"average_head": "cpgan_s64_prior.safetensors", "none": "cpgan_s64.safetensors"}
#: the prior of the default weights: the generator on the anatomical prior, judged on every
#: held-out real head (docs/cpgan/warp/README.md); ``--prior none`` picks the paper's generator
DEFAULT_PRIOR = "average_head"
#: the default weights' name in the weights folder (found by :func:`default_weights_file`)
WEIGHTS_NAME = SHIPPED_WEIGHTS[DEFAULT_PRIOR]
#: where the default weights sit in the installed package; when the file is not there,
#: :func:`default_weights_file` finds it in ``$ANONMRI_WEIGHTS_DIR``, the user cache, or fetches it
DEFAULT_WEIGHTS = Path(__file__).resolve().parents[1] / "weights" / WEIGHTS_NAME


def shipped_weights_name(prior: Optional[str] = None) -> str:
    """The shipped weights file of ``prior`` (None = :data:`DEFAULT_PRIOR`); WeightsError otherwise."""
    prior = DEFAULT_PRIOR if prior is None else prior
    if prior not in SHIPPED_WEIGHTS:
        raise WeightsError(f"no shipped CP-GAN weights for prior {prior!r}; choose one of: "
                           f"{', '.join(SHIPPED_WEIGHTS)}")
    return SHIPPED_WEIGHTS[prior]


def default_weights_file(progress=None, prior: Optional[str] = None) -> Path:
    """The shipped CP-GAN weights of ``prior`` (None = the default), through
    :func:`AnonMRILib.weights_store.resolve_weights_file`.

    :class:`WeightsError` (what is missing, where it was looked for, how to provide it) when absent.
    """
    from ..weights_store import resolve_weights_file

    return resolve_weights_file(shipped_weights_name(prior), progress=progress, what="CP-GAN weights")


def card_path(weights_path: Union[str, Path]) -> Path:
    """The model card path of a weights file: same name, ``.json``."""
    return Path(weights_path).with_suffix(".json")


def save_generator(path: Union[str, Path], generator, card: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``generator``'s weights (safetensors) and its card with config and SHA-256; returns the card.

    Writes to temporary names first and renames, so a crash never leaves a half-written pair.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in generator.state_dict().items()}
    temporary = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temporary), metadata={"model": MODEL_NAME})
    card = dict(card)
    card["model"] = MODEL_NAME
    card["config"] = generator.config.to_dict()
    card["sha256"] = sha256_of(temporary)
    card["weights_file"] = path.name
    card_temporary = card_path(path).with_name(card_path(path).name + ".tmp")
    card_temporary.write_text(json.dumps(card, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    temporary.chmod(0o644)
    temporary.replace(path)
    card_temporary.replace(card_path(path))
    return card


def read_card(weights_path: Union[str, Path], card: Optional[Union[str, Path]] = None) -> Dict[str, Any]:
    """The model card of ``weights_path`` (WeightsError when missing or not valid JSON).

    ``card``: the card's path when it is not beside the weights (the shipped card stays in the
    package while the weights may come from another folder).
    """
    path = Path(card) if card is not None else card_path(weights_path)
    if not path.is_file():
        raise WeightsError(f"model card {path} is missing (it must sit beside the weights file)")
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise WeightsError(f"model card {path} is not valid JSON ({error})") from None
    if not isinstance(card, dict) or card.get("model") != MODEL_NAME or "config" not in card:
        raise WeightsError(f"model card {path} does not describe a CP-GAN generator")
    return card


def load_generator(weights_path: Optional[Union[str, Path]] = None, device: Any = "cpu",
                   check_sha256: bool = True, prior: Optional[str] = None) -> Tuple[Any, Dict[str, Any]]:
    """(CPGANGenerator in eval mode on ``device``, model card) from a safetensors file + card.

    ``weights_path`` defaults to the shipped weights of ``prior`` (:func:`default_weights_file`,
    with the shipped card; None = :data:`DEFAULT_PRIOR`); a path given is used as it is, its card
    beside it, and ``prior`` must then be None or the card's.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .cpgan import CPGANConfig, CPGANGenerator

    if weights_path is None:
        from ..weights_store import resolve_weights_file

        path = default_weights_file(prior=prior)
        card = read_card(path, resolve_weights_file(card_path(shipped_weights_name(prior)).as_posix(),
                                                    what="CP-GAN model card"))
    else:
        path = Path(weights_path)
        if not path.is_file():
            raise WeightsError(f"CP-GAN weights {path} not found")
        card = read_card(path)
    if check_sha256:
        verify_sha256(path, card.get("sha256", ""), what="CP-GAN weights")
    try:
        config = CPGANConfig.from_dict(card["config"])
    except (TypeError, ValueError) as error:
        raise WeightsError(f"model card {card_path(path)} has an invalid config ({error})") from None
    if prior is not None and config.prior != prior:
        raise WeightsError(f"CP-GAN weights {path} use prior {config.prior!r}, not {prior!r}")
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise WeightsError(f"CP-GAN weights {path} are not a readable safetensors file ({error})") from None
    generator = CPGANGenerator(config)
    try:
        generator.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0]
        raise WeightsError(f"CP-GAN weights {path} do not match the card's configuration ({first})") from None
    generator.eval()
    return generator.to(device), card
