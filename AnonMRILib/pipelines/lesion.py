"""Lesion-preserving anonymization of a brain MRI, slice by slice (paper 4.4.3).

For every axial slice x with lesion mask M (model resolution S x S):

1. ``z_lesion`` = the lesion encoder's posterior mean of ``x * M`` (kept, never modified);
2. ``z_background`` = a latent drawn by the conditional diffusion model given the grade c, the
   mask M and the slice depth D (DDIM with ``steps`` steps by default, or the full DDPM chain);
3. ``x_hat`` = the joint decoder of ``[z_lesion, z_background]``;
4. source repulsion (:class:`SourceRepulsionConfig`, on by default): steps 2-3 are drawn K times;
   among the *typical* draws (foreground area and mean foreground intensity close to the medians
   of the K draws) the one whose non-lesion pixels are least like the input's
   (:func:`background_dissimilarity`, 1 - correlation) is kept. The diffusion model never sees
   the input's background, so plain sampling (K = 1) draws, by chance, anatomy of the patient's
   own kind: on the first generated population of four base heads x_hat was nearest to the
   input's own head for 23 % of the held-out slices, and half of those failed the anonymity
   criterion when x_j came from another head (docs/evaluation/lesion has the current figures).
   Keeping the draw least like the source is ADS-GAN's identifiability constraint (Yoon et al.,
   the paper's ref. 28, where the criterion comes from) applied at sampling time; the typicality
   filter keeps it from choosing degenerate draws (a shrunken or dark brain) that are far from
   every real slice. Only the input slice is used; no other patient is involved. The lesion
   latent is the same for all draws.

:func:`anonymize_lesions` does this on a :class:`Volume` in its own grid:

* the axial axis is the voxel axis most aligned with RAS S; in-plane axes are ordered/flipped to
  R and A so slices look like the training slices; the volume is not reoriented otherwise;
* each slice is resampled (bilinear) to the model grid: a 240 mm square field of view of S x S
  pixels centred on the foreground's bounding-box centre (BraTS geometry), and the generated slice
  is resampled back onto the input's pixels;
* D = 0.5 + (slice position - brain centre along S) / 154 mm, clipped to [0, 1]: for a BraTS
  volume (155 slices of 1 mm, brain centred) this is the slice index / 154;
* intensities: [volume minimum, 99.5th percentile of the voxels above it] -> [0, 1] for the
  model, mapped back and cast (rounded, clipped) to the input's dtype;
* slices with no foreground (every voxel at the volume minimum) are copied unchanged -- there is
  no anatomy in them to anonymize; slices without lesion are generated with an empty M;
* ``exact_lesion``: lesion voxels are copied from the input bit for bit; in a band of
  ``feather_px`` voxels *outside* M (in-plane distance) the output blends linearly from the input
  (next to M) to the generated image, so the boundary has no step; inside M nothing is blended.

Invariants checked before returning (:class:`InvariantError` otherwise): the lesion latent passed
to the joint decoder is the stored encoder output, unchanged, and re-encoding ``x * M`` gives it
again; with ``exact_lesion`` the lesion voxels equal the input's exactly.

An empty lesion mask is refused (``InputError``) unless ``allow_empty_lesion=True``, in which case
every slice is generated with an empty M (the whole brain is remodeled; nothing is preserved).

Whole-head inputs (:mod:`.lesion_head`): the "foreground" above is the brain mask (joined with the
lesion) instead of the voxels above the minimum; only voxels inside it are replaced (the generated
brain is extended to fill all of it, ``fill_brain_mask``), and the face treatment of
``config.face_method`` is applied outside it, so the output is a complete head.
Generated voxels get the input's intensity distribution, noise level and sharpness
(:mod:`AnonMRILib.transforms.appearance`, ``match_appearance``). Slices of a volume are generated
outward from the middle slice, each conditioned on its generated neighbour
(:class:`VolumeConsistencyConfig`).
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import InputError, InvariantError
from ..io.volume import Volume, require_same_grid
from ..progress import ProgressCallback, report, sub_progress
from ..transforms.brain_prior import CONTRASTS, BrainPriorConfig
from .prior_variation import PriorVariationConfig

if TYPE_CHECKING:  # torch is imported lazily (import time on a busy CPU)
    import torch

GRADE_NAMES = {"LGG": 0, "HGG": 1}
#: where the regenerated brain comes from: a placed donor brain (default) or the paper's generator alone
PRIORS = ("donor", "none")
MODEL_FIELD_OF_VIEW_MM = 240.0
BRATS_DEPTH_SPAN_MM = 154.0


@dataclass(frozen=True)
class SourceRepulsionConfig:
    """Source repulsion (module docstring, step 4).

    ``candidates``: background draws per slice (1 = plain sampling; time grows linearly with it).
    A draw is typical when its foreground area (pixels above ``foreground``, model intensities in
    [0, 1]) and mean foreground intensity are within ``area_tolerance`` and
    ``brightness_tolerance`` (fractions) of the medians over the slice's draws; the typical draw
    with the largest :func:`background_dissimilarity` to the input is kept (the first draw if none is).

    Defaults chosen on a validation split of 40 *training* patients (never the held-out ones), as
    the setting with the highest anonymity rate whose kept draws are as realistic as plain
    sampling's (median brain area relative to the input within 10 % of plain sampling's, median
    brightness within 0.03, no more slices below 60 % of the input's area), with K <= 32 so that a
    155-slice volume stays well inside a minute on 2 CPU cores. Shipped 64x64 models, DDIM 10
    steps, on the co-registered data set (``Training/make_lesion_slices.py``): plain sampling
    71.7 %; K = 16 with the first defaults (area 0.15, brightness 0.10) 82.7 %; K = 32 with area
    0.15: 84.2 %; these defaults 85.6 % (area 1.00 vs 1.04 of the input's, brightness 0.84 vs 0.86,
    slices below 60 % area 0.6 % vs 1.7 %); an ideal sampler blind to the input (a real slice of
    another training patient with the lesion pasted in) 86.5 %. Without the typicality filter,
    keeping the draw with the largest MSE to the input reached 92.7 % on the first data set, but
    26 % of the kept slices had lost over 40 % of the brain's area -- a shrunken, darkened image
    is far from everyone and passes the criterion without anonymizing anything; hence the filter
    and the brightness-blind correlation distance.

    Sharpness constraint (``min_sharpness_ratio``, realism guard of
    :mod:`AnonMRILib.evaluation.realism`): among the typical draws only those at least this sharp
    relative to the input (mean in-plane gradient magnitude inside the brain interior, generated /
    input) are eligible, where any exists; where none is, the rule above applies unchanged (so the
    choice never gets *less* anonymous; the evaluation then reports the slice as not realistic).
    0 disables it. A blurrier draw is farther from the input by 1 - correlation too, so without
    the constraint repulsion prefers blur.
    """

    candidates: int = 32
    area_tolerance: float = 0.20
    brightness_tolerance: float = 0.12
    foreground: float = 0.05
    min_sharpness_ratio: float = 0.8

    def __post_init__(self) -> None:
        if int(self.candidates) < 1:
            raise InputError(f"candidates must be at least 1, got {self.candidates}")


@dataclass(frozen=True)
class VolumeConsistencyConfig:
    """Consistent volumes (the paper anonymizes slices independently, its stated limitation):
    slices are generated along the slice axis, each conditioned on the already generated neighbour
    (:func:`anonymize_lesion_slices` with ``positions_mm``). The order is two chains outward from
    the middle slice, run in one batch (:func:`consistency_rounds`): every slice but the middle one
    is conditioned on a neighbour, as in one bottom-to-top pass, at 0.78x its CPU time per slice
    together with the channels-last decoder of :func:`load_lesion_models` (shipped models, 32
    draws, one thread, old and new code alternated on a shared CPU: 257 vs 329 ms, median of 3).
    Until then the volume was one chain from the lowest slice; the defaults below were chosen
    then, the conditioning of a slice on its neighbour is the same:

    * the initial noise is an AR(1) process along depth: z_T(k) = rho z_T(k-1) + sqrt(1 - rho^2) eps,
      rho = exp(-gap_mm / ``noise_correlation_mm``), z_T(k-1) the kept draw's;
    * an inpainting-style blend in latent space: during the first ``guided_fraction`` of the DDIM
      steps each draw's z_t is pulled towards the kept neighbour's z_t at the same step,
      z_t <- (1 - w) z_t + w z_t(k-1), w = ``neighbour_weight`` * rho; later steps are free, so a
      slice keeps its own detail and its lesion.

    Source repulsion still chooses among the K draws of each slice; all of them share the
    neighbour's layout, so the choice no longer breaks the volume apart.

    Defaults chosen on one whole generated patient outside the training set (head 0, 1 mm slices,
    K = 8 draws, shipped 64 x 64 models) as the setting whose adjacent-slice correlation is
    closest to the real volume's (real 0.921; independent slices 0.745): (20 mm, 0.8, 0.6) 0.993,
    (20, 0.5, 0.5) 0.992, (10, 0.5, 0.3) 0.980, (5, 0.5, 0.5) 0.989, these (3, 0.3, 0.3) 0.958.
    Correlated noise alone makes neighbours nearly identical (the DDIM sampler is deterministic),
    hence the short correlation length. Held-out figures: ``evaluate_lesion.py --parts consistency`` (README).
    """

    noise_correlation_mm: float = 3.0
    neighbour_weight: float = 0.3
    guided_fraction: float = 0.3

    def __post_init__(self) -> None:
        if self.noise_correlation_mm <= 0 or not 0.0 <= self.neighbour_weight <= 1.0 \
                or not 0.0 <= self.guided_fraction <= 1.0:
            raise InputError("volume consistency: noise_correlation_mm > 0, neighbour_weight and guided_fraction "
                             "in [0, 1]")


@dataclass(frozen=True)
class LesionAnonymizationConfig:
    """Options of :func:`anonymize_lesions`.

    ``steps``: DDIM steps (the fast sampler); ``sampler``: ``"ddim"`` or ``"ddpm"`` (full T-step
    chain, slow); ``repulsion``: :class:`SourceRepulsionConfig` (``candidates=1`` = plain sampling);
    ``grade``: ``"LGG"``, ``"HGG"`` or None (unknown); ``feather_px``: width in input voxels of
    the blend band outside the lesion with ``exact_lesion``; ``batch_size``: slices per network call.

    Whole-head inputs (:mod:`.lesion_head`): ``input_kind`` ``"auto"`` (detected), ``"head"`` or
    ``"brain"`` (skull-stripped); ``face_method``: what happens outside the brain of a head
    (:data:`~AnonMRILib.pipelines.lesion_head.FACE_METHODS`; ``"none"`` keeps the face, warns);
    ``brain_backend``: brain-mask backend when no mask is given. ``match_appearance``: give the
    generated voxels the input's intensity distribution and sharpness
    (:mod:`AnonMRILib.transforms.appearance`; ``sharpness_target`` = wanted sharpness ratio).
    ``consistency``: :class:`VolumeConsistencyConfig` (None = independent slices, the paper's way).
    ``fill_brain_mask``: whole-head inputs only -- give the brain-mask pixels that the generated
    brain does not reach tissue extrapolated from it
    (:func:`~AnonMRILib.pipelines.lesion_head.fill_brain_mask`) instead of the model's black
    background; False keeps the previous behaviour (black, blocky holes at the brain's edge).
    ``parallel_face``: whole-head inputs -- run the face treatment (it needs only the input and the
    brain mask) in a second thread while the brain is generated, so a second core is used; the
    output is the same either way (the face methods are seeded), only the face's progress is not
    reported. Face method ``none`` always runs in line (it warns).

    ``prior``: ``"donor"`` (default) regenerates the brain on a placed donor-brain prior
    (:mod:`.lesion_prior`, :mod:`AnonMRILib.transforms.brain_prior`, settings ``brain_prior``;
    ``contrast`` names the input's sequence or ``"auto"``); ``"none"`` is the paper's generator
    (latent diffusion from grade, mask and depth; the settings above from ``steps`` to
    ``fill_brain_mask`` apply to it only). ``edge_blend_px`` (donor prior, whole heads): in a band
    of that many voxels (in-plane) outside the brain mask the output blends linearly from the
    regenerated brain (next to the mask) to the face treatment's voxels, so a jagged brain mask on
    thick slices leaves no step; brain voxels are never blended. 0 = a hard edge.
    """

    steps: int = 10
    sampler: str = "ddim"
    repulsion: SourceRepulsionConfig = SourceRepulsionConfig()
    exact_lesion: bool = False
    grade: Optional[str] = None
    feather_px: int = 2
    batch_size: int = 64
    allow_empty_lesion: bool = False
    input_kind: str = "auto"
    face_method: str = "remodel"
    brain_backend: str = "auto"
    match_appearance: bool = True
    sharpness_target: float = 1.0
    consistency: Optional[VolumeConsistencyConfig] = VolumeConsistencyConfig()
    fill_brain_mask: bool = True
    parallel_face: bool = True
    prior: str = "donor"
    contrast: str = "auto"
    brain_prior: BrainPriorConfig = BrainPriorConfig()
    variation: PriorVariationConfig = PriorVariationConfig()
    edge_blend_px: int = 2

    def __post_init__(self) -> None:
        if self.prior not in PRIORS:
            raise InputError(f"unknown prior {self.prior!r} (use one of {', '.join(PRIORS)})")
        if self.contrast not in CONTRASTS:
            raise InputError(f"unknown contrast {self.contrast!r} (use one of {', '.join(CONTRASTS)})")


@dataclass
class LesionModels:
    """The trained networks and the background latent standardisation."""

    autoencoder: object
    diffusion: object
    latent_scale: float
    latent_shift: float
    device: object

    @property
    def image_size(self) -> int:
        return int(self.autoencoder.config.image_size)


def load_lesion_models(weights=None, device: str = "auto", prior: bool = False) -> LesionModels:
    """Networks from a folder with lesion_vae/lesion_diffusion safetensors (None: the package's;
    ``prior``: the donor-brain prior's 240 x 240 models with the prior-conditioned diffusion model)."""
    from ..device import resolve_device
    from ..models.lesion_weights import load_lesion_diffusion, load_lesion_vae, resolve_weights

    torch_device = resolve_device(device)
    vae_path, diffusion_path = resolve_weights(weights, prior=prior)
    autoencoder = load_lesion_vae(vae_path, torch_device)
    diffusion, scale, shift = load_lesion_diffusion(diffusion_path, torch_device)
    if diffusion.config.image_size != autoencoder.config.image_size:
        from ..errors import WeightsError

        raise WeightsError("the VAE and diffusion weights were trained at different slice sizes")
    if torch_device.type == "cpu":
        import torch

        # decoding the K draws of every slice at 64 x 64 runs ~2x faster per draw in channels-last
        # memory on a CPU (same numbers up to float rounding, ~1e-7); the 8 x 8 denoiser gains nothing
        autoencoder.joint_decoder.to(memory_format=torch.channels_last)
    return LesionModels(autoencoder, diffusion, scale, shift, torch_device)


def grade_index(grade: Optional[Union[str, int]], num_classes: int) -> int:
    """Class index for a grade name/number; None -> the model's "unknown" class."""
    if grade is None:
        return num_classes
    if isinstance(grade, str):
        if grade.upper() not in GRADE_NAMES:
            raise InputError(f"unknown grade {grade!r} (use LGG or HGG)")
        return GRADE_NAMES[grade.upper()]
    if not 0 <= int(grade) < num_classes:
        raise InputError(f"grade index {grade} is outside 0..{num_classes - 1}")
    return int(grade)


def background_dissimilarity(candidate: "torch.Tensor", source: "torch.Tensor",
                              lesion_mask: "torch.Tensor") -> "torch.Tensor":
    """1 - Pearson correlation between ``candidate`` and ``source`` over the pixels outside
    ``lesion_mask``, per slice: tensors (B, 1, S, S) -> (B,) in [0, 2]. Blind to overall brightness
    and contrast (a darker copy of the source is not "far" from it) and to the lesion, which is kept
    on purpose; a constant image (or a slice that is all lesion) gets 1."""
    outside = 1.0 - lesion_mask
    count = outside.sum(dim=(1, 2, 3), keepdim=True).clamp_min(1.0)
    a = (candidate - (candidate * outside).sum(dim=(1, 2, 3), keepdim=True) / count) * outside
    b = (source - (source * outside).sum(dim=(1, 2, 3), keepdim=True) / count) * outside
    covariance = (a * b).sum(dim=(1, 2, 3))
    norm = ((a ** 2).sum(dim=(1, 2, 3)) * (b ** 2).sum(dim=(1, 2, 3))).sqrt()
    return 1.0 - covariance / norm.clamp_min(1e-12)


def typical_draws(draws: "torch.Tensor", config: SourceRepulsionConfig) -> "torch.Tensor":
    """(K, B, 1, S, S) draws -> (K, B) bool: foreground area and mean foreground intensity within the
    config's tolerances of the medians over the K draws of each slice (torch's lower median)."""
    import torch

    foreground = draws > config.foreground
    area = foreground.sum(dim=(2, 3, 4)).float()
    brightness = (draws * foreground).sum(dim=(2, 3, 4)) / area.clamp_min(1.0)
    typical = torch.ones_like(area, dtype=torch.bool)
    for values, tolerance in ((area, config.area_tolerance), (brightness, config.brightness_tolerance)):
        median = values.median(dim=0).values
        typical &= (values - median).abs() <= tolerance * median
    return typical


def sharp_draws(draws: "torch.Tensor", source: "torch.Tensor", config: SourceRepulsionConfig) -> "torch.Tensor":
    """(K, B) bool: sharpness ratio (:func:`AnonMRILib.evaluation.realism.sharpness_ratio`) of each
    draw to ``source`` at least ``config.min_sharpness_ratio``. ``draws`` (K, B, 1, S, S)."""
    import torch

    from ..evaluation.realism import sharpness_ratio

    count, batch = draws.shape[:2]
    if config.min_sharpness_ratio <= 0:
        return torch.ones((count, batch), dtype=torch.bool, device=draws.device)
    sources = source[:, 0].detach().cpu().numpy()
    ratios = sharpness_ratio(draws[:, :, 0].detach().cpu().numpy().reshape((count * batch,) + sources.shape[1:]),
                             sources[None].repeat(count, axis=0).reshape((count * batch,) + sources.shape[1:]),
                             foreground=config.foreground).reshape(count, batch)
    return torch.from_numpy(np.nan_to_num(ratios, nan=1.0) >= config.min_sharpness_ratio).to(draws.device)


def repelled_choice(draws: "torch.Tensor", source: "torch.Tensor", lesion_mask: "torch.Tensor",
                    config: SourceRepulsionConfig) -> "torch.Tensor":
    """Index (B,) of the kept draw: the typical draw (:func:`typical_draws`) farthest from ``source``
    outside the lesion (:func:`background_dissimilarity`), among the typical draws that are sharp
    enough (:func:`sharp_draws`) where any is; the first draw where none is typical.
    ``draws`` (K, B, 1, S, S); ``source``, ``lesion_mask`` (B, 1, S, S)."""
    import torch

    distances = torch.stack([background_dissimilarity(draw, source, lesion_mask) for draw in draws])
    typical = typical_draws(draws, config)
    if len(draws) > 1:
        sharp_and_typical = typical & sharp_draws(draws, source, config)
        typical = torch.where(sharp_and_typical.any(dim=0, keepdim=True), sharp_and_typical, typical)
    choice = torch.where(typical, distances, torch.full_like(distances, -1.0)).argmax(dim=0)
    return torch.where(typical.any(dim=0), choice, torch.zeros_like(choice))


def anonymize_lesion_slices(models: LesionModels, images: np.ndarray, masks: np.ndarray, grades: np.ndarray,
                            depths: np.ndarray, steps: int = 10, sampler: str = "ddim", seed: int = 0,
                            batch_size: int = 64, progress: Optional[ProgressCallback] = None,
                            return_latents: bool = False, repulsion: Optional[SourceRepulsionConfig] = None,
                            positions_mm: Optional[np.ndarray] = None,
                            consistency: Optional[VolumeConsistencyConfig] = None):
    """Anonymize model-size slices: images (N, S, S) in [0, 1], masks (N, S, S) {0, 1}, grades (N,)
    class indices (``num_classes`` = unknown), depths (N,) in [0, 1] -> (N, S, S) float32 in [0, 1].

    ``repulsion`` (default :class:`SourceRepulsionConfig`) draws several backgrounds per slice and
    keeps :func:`repelled_choice`. Checks the lesion-latent invariant (see the module docstring).
    Deterministic in ``seed``; with ``candidates=1`` (plain sampling) the draw is the first of any
    larger ``candidates`` with the same seed and batch size.

    ``positions_mm`` (N,) (the slices' positions along the slice axis of one volume) with a
    ``consistency`` config: each slice is conditioned on the kept draw of its neighbour along them,
    generated outward from the middle slice (:class:`VolumeConsistencyConfig`,
    :func:`consistency_rounds`); otherwise independently.
    """
    import torch

    from ..models.latent_diffusion import sample_latents

    repulsion = repulsion or SourceRepulsionConfig()
    if consistency is not None and positions_mm is not None:
        return _consistent_slices(models, images, masks, grades, depths, np.asarray(positions_mm, dtype=np.float64),
                                  steps, sampler, seed, progress, return_latents, repulsion, consistency)
    candidates = repulsion.candidates
    autoencoder, diffusion, device = models.autoencoder, models.diffusion, models.device
    autoencoder.eval()
    diffusion.eval()
    generator = torch.Generator().manual_seed(int(seed))
    outputs, lesion_latents = [], []
    count = len(images)
    for start in range(0, count, batch_size):
        stop = min(count, start + batch_size)
        x = torch.from_numpy(np.ascontiguousarray(images[start:stop], dtype=np.float32))[:, None].to(device)
        m = torch.from_numpy(np.ascontiguousarray(masks[start:stop], dtype=np.float32))[:, None].to(device)
        c = torch.from_numpy(np.asarray(grades[start:stop], dtype=np.int64)).to(device)
        d = torch.from_numpy(np.asarray(depths[start:stop], dtype=np.float32)).to(device)
        with torch.no_grad():
            z_lesion, _ = autoencoder.encode_lesion(x, m)
            z_lesion_stored = z_lesion.clone()
            draws = []
            for draw in range(candidates):
                share = (stop - start) / count / candidates
                part = sub_progress(progress, start / count + draw * share, start / count + (draw + 1) * share)
                z_background = sample_latents(diffusion, c, m, d, steps=steps, sampler=sampler, generator=generator,
                                              progress=part)
                z_background = z_background * models.latent_scale + models.latent_shift
                draws.append(autoencoder.decode_joint(z_lesion, z_background).clamp(0.0, 1.0))
            draws = torch.stack(draws)
            x_hat = draws[repelled_choice(draws, x, m, repulsion), torch.arange(len(x))]
            z_lesion_again, _ = autoencoder.encode_lesion(x, m)
        if not torch.equal(z_lesion, z_lesion_stored):
            raise InvariantError("the lesion latent was modified during generation")
        if not torch.allclose(z_lesion_again, z_lesion_stored, rtol=1e-4, atol=1e-5):
            raise InvariantError("the lesion latent used for decoding is not the lesion encoder's output")
        outputs.append(x_hat[:, 0].cpu().numpy())
        lesion_latents.append(z_lesion_stored.cpu().numpy())
    generated = np.concatenate(outputs).astype(np.float32) if outputs else np.zeros_like(images, dtype=np.float32)
    if return_latents:
        return generated, np.concatenate(lesion_latents) if lesion_latents else None
    return generated


def consistency_rounds(positions_mm: np.ndarray) -> list:
    """Generation order of :func:`_consistent_slices`: a list of rounds, each a list of
    (slice index, neighbour index or None). Round 0 is the middle slice (along ``positions_mm``);
    round r generates the r-th slice above and the r-th slice below it, each conditioned on the
    neighbour generated in round r - 1, so the two chains run outward in one batch and every slice
    but the middle one has a generated neighbour."""
    order = np.argsort(np.asarray(positions_mm, dtype=np.float64), kind="stable")
    count = len(order)
    if count == 0:
        return []
    middle = count // 2
    rounds = [[(int(order[middle]), None)]]
    for step in range(1, max(middle, count - 1 - middle) + 1):
        pairs = []
        if middle + step < count:
            pairs.append((int(order[middle + step]), int(order[middle + step - 1])))
        if middle - step >= 0:
            pairs.append((int(order[middle - step]), int(order[middle - step + 1])))
        rounds.append(pairs)
    return rounds


def _consistent_slices(models: LesionModels, images, masks, grades, depths, positions_mm, steps, sampler, seed,
                       progress, return_latents, repulsion, consistency):
    """:func:`anonymize_lesion_slices` with each slice's K draws conditioned on the kept draw of its
    generated neighbour (:class:`VolumeConsistencyConfig`), in the rounds of
    :func:`consistency_rounds`: two chains outward from the middle slice, both in one network batch
    (2 K draws per call instead of K; the small denoiser runs ~1.4x faster per draw on one CPU
    thread at 64 draws than at 32)."""
    import torch

    from ..models.latent_diffusion import sample_latents

    autoencoder, diffusion, device = models.autoencoder, models.diffusion, models.device
    autoencoder.eval()
    diffusion.eval()
    generator = torch.Generator().manual_seed(int(seed))
    config = diffusion.config
    candidates = repulsion.candidates
    count = len(images)
    outputs = np.zeros((count,) + tuple(np.shape(images)[1:]), dtype=np.float32)
    lesion_latents = [None] * count
    guided = int(round(consistency.guided_fraction * (steps if sampler == "ddim" else config.num_train_timesteps)))
    kept_noise, kept_trajectory = {}, {}
    done = 0
    for pairs in consistency_rounds(positions_mm):
        indices = [index for index, _ in pairs]
        n = len(indices)
        x = torch.from_numpy(np.ascontiguousarray(images[indices], dtype=np.float32))[:, None].to(device)
        m = torch.from_numpy(np.ascontiguousarray(masks[indices], dtype=np.float32))[:, None].to(device)
        c = torch.from_numpy(np.asarray(grades[indices], dtype=np.int64)).to(device).repeat_interleave(candidates)
        d = torch.from_numpy(np.asarray(depths[indices], dtype=np.float32)).to(device).repeat_interleave(candidates)
        shape = (candidates, config.latent_channels, config.latent_size, config.latent_size)
        noises, weights, neighbours = [], [], []
        for index, neighbour in pairs:
            noise = torch.randn(shape, generator=generator, device="cpu").to(device)
            weight = 0.0
            if neighbour is not None:
                gap = abs(positions_mm[index] - positions_mm[neighbour])
                rho = float(np.exp(-gap / consistency.noise_correlation_mm))
                noise = rho * kept_noise[neighbour][None] + (1.0 - rho ** 2) ** 0.5 * noise
                weight = consistency.neighbour_weight * rho
            noises.append(noise)
            weights.append(weight)
            neighbours.append(kept_trajectory.get(neighbour))
        noise = torch.cat(noises)
        blend = torch.tensor(weights, dtype=noise.dtype, device=device).repeat_interleave(candidates)
        blend = blend[:, None, None, None]
        guide = None
        if any(w > 0 for w in weights):  # per step: each slice's neighbour latent, once per draw
            empty = torch.zeros(shape[1:], device=device)
            guide = [torch.stack([neighbours[j][step] if neighbours[j] is not None else empty for j in range(n)])
                     .repeat_interleave(candidates, dim=0) for step in range(guided)]
        trajectory = []

        def hook(step: int, z, guide=guide, blend=blend, trajectory=trajectory):
            if guide is not None and step < guided:
                z = (1.0 - blend) * z + blend * guide[step]
            trajectory.append(z)
            return z

        with torch.no_grad():
            z_lesion, _ = autoencoder.encode_lesion(x, m)
            z_lesion_stored = z_lesion.clone()
            part = sub_progress(progress, done / count, (done + n) / count)
            z_background = sample_latents(diffusion, c, m.repeat_interleave(candidates, dim=0), d, steps=steps,
                                          sampler=sampler, generator=generator, progress=part, initial_noise=noise,
                                          step_hook=hook)
            z_background = z_background * models.latent_scale + models.latent_shift
            draws = autoencoder.decode_joint(z_lesion.repeat_interleave(candidates, dim=0), z_background)
            draws = draws.clamp(0.0, 1.0)
            draws = draws.reshape((n, candidates) + tuple(draws.shape[1:])).transpose(0, 1)  # (K, n, 1, S, S)
            kept = repelled_choice(draws, x, m, repulsion)
            z_lesion_again, _ = autoencoder.encode_lesion(x, m)
        if not torch.equal(z_lesion, z_lesion_stored):
            raise InvariantError("the lesion latent was modified during generation")
        if not torch.allclose(z_lesion_again, z_lesion_stored, rtol=1e-4, atol=1e-5):
            raise InvariantError("the lesion latent used for decoding is not the lesion encoder's output")
        for j, index in enumerate(indices):
            row = j * candidates + int(kept[j])
            outputs[index] = draws[int(kept[j]), j, 0].cpu().numpy()
            lesion_latents[index] = z_lesion_stored[j].cpu().numpy()
            kept_noise[index] = noise[row]
            kept_trajectory[index] = [z[row] for z in trajectory[:guided]]
        for _, neighbour in pairs:  # a neighbour is needed by one round only
            kept_noise.pop(neighbour, None)
            kept_trajectory.pop(neighbour, None)
        done += n
    if return_latents:
        return outputs, np.stack(lesion_latents) if count else None
    return outputs


# --- geometry: input grid <-> model slices ---------------------------------------------------------------
def axial_layout(affine: np.ndarray) -> Tuple[Tuple[int, int, int], Tuple[bool, bool, bool]]:
    """(axes order (R-like, A-like, S-like), flips) so that ``flip(transpose(array, order))`` is
    indexed [right, anterior, superior]-increasing."""
    direction = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    axial = int(np.argmax(np.abs(direction[2])))
    in_plane = [a for a in range(3) if a != axial]
    if abs(direction[0, in_plane[0]]) < abs(direction[0, in_plane[1]]):
        in_plane = in_plane[::-1]
    order = (in_plane[0], in_plane[1], axial)
    flips = tuple(bool(direction[row, axis] < 0) for row, axis in zip(range(3), order))
    return order, flips  # type: ignore[return-value]


def to_ras_layout(array: np.ndarray, order, flips) -> np.ndarray:
    out = np.transpose(array, order)
    for axis, flip in enumerate(flips):
        if flip:
            out = np.flip(out, axis)
    return out


def from_ras_layout(array: np.ndarray, order, flips) -> np.ndarray:
    for axis, flip in enumerate(flips):
        if flip:
            array = np.flip(array, axis)
    return np.transpose(array, np.argsort(order))


def _model_coordinates(spacing_in_plane, center_index, shape_in_plane, size: int):
    """Input in-plane pixel coordinates of each model pixel (2, size, size)."""
    pixel = MODEL_FIELD_OF_VIEW_MM / size
    offsets = (np.arange(size) - (size - 1) / 2.0) * pixel
    u = center_index[0] + offsets / spacing_in_plane[0]
    v = center_index[1] + offsets / spacing_in_plane[1]
    return np.stack(np.meshgrid(u, v, indexing="ij"))


def slices_to_model(stack: np.ndarray, spacing_in_plane, center_index, size: int, order: int = 1) -> np.ndarray:
    """(N, H, W) input slices -> (N, size, size) on the 240 mm model field of view (0 outside)."""
    from scipy import ndimage

    coordinates = _model_coordinates(spacing_in_plane, center_index, stack.shape[1:], size)
    out = np.empty((len(stack), size, size), dtype=np.float32)
    for index, image in enumerate(stack):
        out[index] = ndimage.map_coordinates(image.astype(np.float32), coordinates, order=order, mode="constant",
                                             cval=0.0)
    return out


def slices_from_model(stack: np.ndarray, spacing_in_plane, center_index, shape_in_plane) -> np.ndarray:
    """(N, size, size) model slices -> (N, H, W) on the input's pixels (bilinear; 0 outside the FOV)."""
    from scipy import ndimage

    size = stack.shape[-1]
    pixel = MODEL_FIELD_OF_VIEW_MM / size
    rows = (np.arange(shape_in_plane[0]) - center_index[0]) * spacing_in_plane[0] / pixel + (size - 1) / 2.0
    cols = (np.arange(shape_in_plane[1]) - center_index[1]) * spacing_in_plane[1] / pixel + (size - 1) / 2.0
    coordinates = np.stack(np.meshgrid(rows, cols, indexing="ij"))
    out = np.empty((len(stack),) + tuple(shape_in_plane), dtype=np.float32)
    for index, image in enumerate(stack):
        out[index] = ndimage.map_coordinates(image, coordinates, order=1, mode="constant", cval=0.0)
    return out


def feather_weights(lesion: np.ndarray, width: int) -> np.ndarray:
    """Per-voxel weight of the input in the exact-lesion blend, slices (N, H, W): 1 inside the
    lesion, 1 - d / (width + 1) at in-plane distance d <= width outside it, 0 elsewhere."""
    from scipy import ndimage

    weights = np.zeros(lesion.shape, dtype=np.float32)
    for index, mask in enumerate(lesion):
        if not mask.any():
            continue
        distance = ndimage.distance_transform_edt(~mask)
        weights[index] = np.where(distance <= width, 1.0 - distance / (width + 1.0), 0.0)
        weights[index][mask] = 1.0
    return weights


def lesion_voxels(lesion_mask: Volume, allow_empty: bool = False) -> np.ndarray:
    """Boolean lesion array (any nonzero label is lesion); refuses NaN and, unless allowed, empty masks."""
    data = lesion_mask.array
    if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
        raise InputError("the lesion mask contains NaN or infinite values")
    lesion = data != 0
    if not lesion.any() and not allow_empty:
        raise InputError("the lesion mask is empty (no nonzero voxel); nothing would be preserved -- "
                         "check the file, or allow an empty mask to remodel every slice")
    return lesion


def anonymize_lesions(volume: Volume, lesion_mask: Volume, config: Optional[LesionAnonymizationConfig] = None,
                      weights=None, device: str = "auto", seed: int = 0,
                      progress: Optional[ProgressCallback] = None, brain_mask: Optional[Volume] = None) -> Volume:
    """Remodel the non-lesion anatomy of ``volume`` slice by slice, keeping the lesion's latent
    (and, with ``config.exact_lesion``, its voxels). ``lesion_mask``: any nonzero voxel is lesion,
    on ``volume``'s grid. ``weights``: a folder of weights, a :class:`LesionModels`, or None (the
    package's). ``brain_mask``: the user's brain mask for a whole-head input (else computed).
    Returns a Volume on the input's grid with the input's dtype: brain-only for a skull-stripped
    input, a complete head (``config.face_method`` outside the brain) for a whole-head one."""
    output, _ = anonymize_lesions_with_details(volume, lesion_mask, config, weights, device, seed, progress,
                                               brain_mask)
    return output


def anonymize_lesions_with_details(volume: Volume, lesion_mask: Volume,
                                   config: Optional[LesionAnonymizationConfig] = None, weights=None,
                                   device: str = "auto", seed: int = 0,
                                   progress: Optional[ProgressCallback] = None,
                                   brain_mask: Optional[Volume] = None):
    """:func:`anonymize_lesions` plus details: input kind, lesion voxels outside the brain mask,
    sharpening amount, stage timings (s)."""
    import time

    from ..datasets.slices import intensity_window
    from ..io.writers import cast_to_dtype

    config = config or LesionAnonymizationConfig()
    if config.prior == "donor":
        outputs, details = anonymize_lesion_contrasts([volume], lesion_mask, [config.contrast], config, weights,
                                                      device, seed, progress, brain_mask)
        return outputs[0], details
    timings = {}
    clock = time.perf_counter()
    lesion_input, kind, brain_input, details, face_job = _prepare_regions(volume, lesion_mask, config, device, seed,
                                                                          progress, brain_mask)
    timings["brain_mask"] = time.perf_counter() - clock
    clock = time.perf_counter()
    models = weights if isinstance(weights, LesionModels) else load_lesion_models(weights, device)
    report(progress, 0.2, "preparing slices")
    size = models.image_size
    order, flips = axial_layout(volume.affine)
    image = to_ras_layout(volume.array, order, flips)
    lesion = to_ras_layout(lesion_input, order, flips)
    brain = to_ras_layout(brain_input, order, flips)
    spacing = np.asarray(volume.spacing)[list(order)]
    brain_image = np.where(brain, image, image.min())
    low, high = intensity_window(brain_image)
    normalized = np.clip((brain_image.astype(np.float64) - low) / (high - low), 0.0, 1.0).astype(np.float32)
    present = np.flatnonzero(brain.any(axis=(0, 1)))
    if present.size == 0:
        raise InputError("the image has no foreground")
    box = np.argwhere(brain)
    center = (box.min(0) + box.max(0)) / 2.0
    slices = present
    stack = np.moveaxis(normalized[:, :, slices], -1, 0)
    lesion_stack = np.moveaxis(lesion[:, :, slices], -1, 0)
    model_images = np.clip(slices_to_model(stack, spacing[:2], center[:2], size), 0.0, 1.0)
    soft = slices_to_model(lesion_stack.astype(np.float32), spacing[:2], center[:2], size)
    model_masks = soft >= 0.5
    lost = lesion_stack.reshape(len(slices), -1).any(1) & ~model_masks.reshape(len(slices), -1).any(1)
    model_masks[lost] = soft[lost] > 0.0  # keep small lesions visible at model resolution
    depths = np.clip(0.5 + (slices - center[2]) * spacing[2] / BRATS_DEPTH_SPAN_MM, 0.0, 1.0)
    grades = np.full(len(slices), grade_index(config.grade, models.diffusion.config.num_classes))
    generated = anonymize_lesion_slices(models, model_images, model_masks.astype(np.uint8), grades, depths,
                                        steps=config.steps, sampler=config.sampler, seed=seed,
                                        batch_size=config.batch_size, progress=sub_progress(progress, 0.2, 0.8),
                                        repulsion=config.repulsion, positions_mm=slices * spacing[2],
                                        consistency=config.consistency)
    brain_stack = np.moveaxis(brain[:, :, slices], -1, 0)
    if kind == "head" and config.fill_brain_mask:
        from scipy import ndimage

        from .lesion_head import fill_brain_mask

        # every model pixel whose bilinear footprint reaches the input's brain mask
        model_brain = slices_to_model(brain_stack.astype(np.float32), spacing[:2], center[:2], size) > 0.0
        structure = np.zeros((3, 3, 3), dtype=bool)
        structure[1] = True
        model_brain = ndimage.binary_dilation(model_brain, structure=structure)
        generated, details["brain_mask_filled_fraction"] = fill_brain_mask(generated, model_brain, model_masks,
                                                                           config.repulsion.foreground)
    timings["generation"] = time.perf_counter() - clock
    clock = time.perf_counter()
    report(progress, 0.8, "writing slices back")
    back = slices_from_model(generated, spacing[:2], center[:2], image.shape[:2])
    result_stack = back.astype(np.float64) * (high - low) + low
    original = np.moveaxis(image[:, :, slices], -1, 0).astype(np.float64)
    # the region the output's brain occupies: the input's brain mask for a head (it must fit the
    # skull), the generated foreground for a skull-stripped input (its outline is regenerated too)
    region = brain_stack if kind == "head" else back > 0.05
    if config.match_appearance:
        reference = brain_stack & ~lesion_stack
        pixel_ratio = (MODEL_FIELD_OF_VIEW_MM / size) / spacing[:2]
        matched, appearance = match_sharpness_of(result_stack, original, region & ~lesion_stack, reference,
                                                 pixel_ratio / 2.0, config.sharpness_target, seed)
        details.update(appearance)
        result_stack = np.where(region, matched, result_stack)
    timings["write_back_and_appearance"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if config.exact_lesion:
        weight = feather_weights(lesion_stack, config.feather_px)
        result_stack = weight * original + (1.0 - weight) * result_stack
    result = image.astype(np.float64).copy()
    if kind == "brain":
        result[:, :, slices] = np.moveaxis(result_stack, 0, -1)
    output = cast_to_dtype(result, volume.dtype)
    if kind == "head":
        outside = _face_outside(volume, brain_input, config, face_job, seed, device, progress, timings)
        if face_job is not None:
            details["face_in_parallel"] = True
        composed = to_ras_layout(np.asarray(outside.array), order, flips).copy()
        generated_brain = cast_to_dtype(np.moveaxis(result_stack, 0, -1), volume.dtype)
        inside = brain[:, :, slices]
        composed_slices = composed[:, :, slices]
        composed_slices[inside] = generated_brain[inside]
        composed[:, :, slices] = composed_slices
        output = composed
    if config.exact_lesion:
        output[lesion] = image[lesion]
    output = np.ascontiguousarray(from_ras_layout(output, order, flips))
    if config.exact_lesion and not np.array_equal(output[lesion_input], volume.array[lesion_input]):
        raise InvariantError("lesion voxels differ from the input although exact_lesion was asked for")
    # feather, cast, checks (and the wait for a parallel face treatment)
    timings["compose"] = time.perf_counter() - clock - (0.0 if face_job is not None else timings.get("face", 0.0))
    details["timings_s"] = {k: round(v, 2) for k, v in timings.items()}
    report(progress, 1.0, "done")
    return volume.with_array(output), details


def _prepare_regions(volume: Volume, lesion_mask: Volume, config: LesionAnonymizationConfig, device: str, seed: int,
                     progress: Optional[ProgressCallback], brain_mask: Optional[Volume]):
    """Checks, then (lesion bool array, input kind, brain region bool array (joined with the lesion),
    details, the face treatment started in a background thread or None) for one input."""
    from ..io.volume import require_usable_image
    from .lesion_head import FACE_METHODS, brain_region, face_treatment, input_kind

    require_same_grid(volume, lesion_mask, what="lesion mask")
    require_usable_image(volume)
    lesion_input = lesion_voxels(lesion_mask, config.allow_empty_lesion)
    if config.steps < 1 or config.steps > 1000:
        raise InputError(f"steps must be between 1 and 1000, got {config.steps}")
    if config.face_method not in FACE_METHODS:
        raise InputError(f"unknown face method {config.face_method!r} (use one of {', '.join(FACE_METHODS)})")
    grade_index(config.grade, len(GRADE_NAMES))
    face_job = None
    kind = input_kind(volume, config.input_kind)
    details = {"input_kind": kind, "lesion_voxels_outside_brain": 0}
    if kind == "head":
        from ..transforms.brain_mask import resolve_brain_mask

        report(progress, 0.0, "brain mask")
        mask_volume = resolve_brain_mask(volume, brain_mask, backend=config.brain_backend, device=device,
                                         progress=None if brain_mask is not None else sub_progress(progress, 0.0, 0.2))
        brain_input, details["lesion_voxels_outside_brain"] = brain_region(mask_volume.array != 0, lesion_input)
        if config.parallel_face and config.face_method != "none":
            # the face treatment needs only the input and the brain mask: run it on another core
            # while the brain is generated (its progress is not reported; see parallel_face)
            face_job = BackgroundJob(face_treatment, volume, volume.with_array(brain_input.astype(np.uint8)),
                                     config.face_method, seed=seed, device=device,
                                     slice_thickness_mm=config.brain_prior.slice_thickness_mm)
    else:
        if brain_mask is not None:
            from ..transforms.brain_mask import user_brain_mask

            brain_input = (user_brain_mask(brain_mask, volume).array != 0) | lesion_input
        else:
            brain_input = volume.array > volume.array.min()
    return lesion_input, kind, brain_input, details, face_job


def _face_outside(volume: Volume, brain_input: np.ndarray, config: LesionAnonymizationConfig, face_job, seed: int,
                  device: str, progress: Optional[ProgressCallback], timings: dict) -> Volume:
    """The face treatment's result for a whole head: the background job's, or run now."""
    import time

    from .lesion_head import face_treatment

    report(progress, 0.85, f"face: {config.face_method}")
    if face_job is not None:
        outside = face_job.result()
        timings["face"] = face_job.seconds  # its own wall time, overlapping the generation
        return outside
    clock = time.perf_counter()
    outside = face_treatment(volume, volume.with_array(brain_input.astype(np.uint8)), config.face_method, seed=seed,
                             device=device, progress=sub_progress(progress, 0.85, 0.99),
                             slice_thickness_mm=config.brain_prior.slice_thickness_mm)
    timings["face"] = time.perf_counter() - clock
    return outside


def anonymize_lesion_contrasts(volumes: Sequence[Volume], lesion_mask: Volume, contrasts: Optional[Sequence[str]] = None,
                               config: Optional[LesionAnonymizationConfig] = None, weights=None, device: str = "auto",
                               seed: int = 0, progress: Optional[ProgressCallback] = None,
                               brain_mask: Optional[Volume] = None) -> Tuple[List[Volume], dict]:
    """Lesion-preserving anonymization of one or several co-registered contrasts of one patient on
    one grid (BraTS: T1, T1c, T2, FLAIR) on the donor-brain prior (:mod:`.lesion_prior`): one placed
    anatomy, rendered in each contrast. ``contrasts``: a name of
    :data:`~AnonMRILib.transforms.brain_prior.CONTRASTS` per volume (default all ``"auto"``); the
    first volume is the reference whose tissue classes every contrast uses, and whose brain mask is
    computed for a whole head. Returns (outputs in each input's dtype, details). Whole heads: the
    reference gets ``config.face_method`` outside the brain, the other contrasts carry its face
    (:func:`~AnonMRILib.pipelines.multicontrast.carry_face`)."""
    import time

    from ..io.volume import require_usable_image
    from ..io.writers import cast_to_dtype
    from .lesion_prior import generate_on_brain_prior

    config = config or LesionAnonymizationConfig()
    volumes = list(volumes)
    if not volumes:
        raise InputError("give at least one image")
    contrasts = list(contrasts) if contrasts is not None else ["auto"] * len(volumes)
    if len(contrasts) != len(volumes):
        raise InputError(f"{len(volumes)} images but {len(contrasts)} contrast names")
    for name in contrasts:
        if name not in CONTRASTS:
            raise InputError(f"unknown contrast {name!r} (use one of {', '.join(CONTRASTS)})")
    if config.prior != "donor":
        if len(volumes) > 1:
            raise InputError("several contrasts need the donor-brain prior (prior 'none' generates one T1-like image)")
        output, details = anonymize_lesions_with_details(volumes[0], lesion_mask, config, weights, device, seed,
                                                         progress, brain_mask)
        return [output], details
    for index, other in enumerate(volumes[1:], start=2):
        require_same_grid(volumes[0], other, what=f"image {index}")
        require_usable_image(other, what=f"image {index}")
    timings = {}
    clock = time.perf_counter()
    reference = volumes[0]
    lesion_input, kind, brain_input, details, face_job = _prepare_regions(reference, lesion_mask, config, device, seed,
                                                                          progress, brain_mask)
    timings["brain_mask"] = time.perf_counter() - clock
    clock = time.perf_counter()
    models = None
    if not config.exact_lesion or config.variation.strength > 0:
        models = weights if isinstance(weights, LesionModels) else load_lesion_models(weights, device, prior=True)
    brains, prior_details, region = generate_on_brain_prior(volumes, lesion_input, brain_input, contrasts, config,
                                                            models, seed, sub_progress(progress, 0.2, 0.85), kind)
    details.update(prior_details)
    timings["generation"] = time.perf_counter() - clock
    clock = time.perf_counter()
    outputs = []
    for index, (volume, generated) in enumerate(zip(volumes, brains)):
        data = np.asarray(volume.array)
        if kind == "head":
            if index == 0:
                outside = np.asarray(_face_outside(volume, brain_input, config, face_job, seed, device, progress,
                                                   timings).array)
                reference_out = reference.with_array(outside)
                details["face_in_parallel"] = face_job is not None
            elif config.face_method == "none":
                outside = data
            else:
                from .multicontrast import carry_face

                outside = np.asarray(carry_face(reference, reference_out,
                                                reference.with_array(brain_input.astype(np.uint8)), volume,
                                                other_brain=volume.with_array(brain_input.astype(np.uint8))).array)
            result = np.array(outside, copy=True)
            if config.edge_blend_px > 0:
                slice_axis = axial_layout(volume.affine)[0][2]
                weight = np.moveaxis(feather_weights(np.moveaxis(brain_input, slice_axis, 0), config.edge_blend_px),
                                     0, slice_axis)
                band = (weight > 0) & ~brain_input
                result[band] = cast_to_dtype(weight[band] * generated[band] + (1.0 - weight[band]) * result[band],
                                             volume.dtype)
        else:  # brain only: the output's brain is the regenerated region (the donor's outline by default)
            result = np.full(data.shape, data.min(), dtype=data.dtype)
        result[region] = cast_to_dtype(generated[region], volume.dtype)
        if config.exact_lesion:
            result[lesion_input] = data[lesion_input]
            if not np.array_equal(result[lesion_input], data[lesion_input]):
                raise InvariantError("lesion voxels differ from the input although exact_lesion was asked for")
        outputs.append(volume.with_array(np.ascontiguousarray(result)))
    timings["compose"] = time.perf_counter() - clock - (0.0 if face_job is not None else timings.get("face", 0.0))
    details["timings_s"] = {k: round(v, 2) for k, v in timings.items()}
    report(progress, 1.0, "done")
    return outputs, details


class BackgroundJob:
    """``function(*args, **kwargs)`` started in a daemon thread; :meth:`result` waits for it and
    returns its value or raises its exception; ``seconds`` is its wall time. Torch, SimpleITK,
    SciPy and NumPy release the GIL in their heavy calls, so the job uses another core."""

    def __init__(self, function, *args, **kwargs) -> None:
        import threading

        self.seconds = 0.0
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(function, args, kwargs), daemon=True,
                                        name="anonmri-background")
        self._thread.start()

    def _run(self, function, args, kwargs) -> None:
        import time

        start = time.perf_counter()
        try:
            self._value = function(*args, **kwargs)
        except BaseException as error:  # handed to the caller by result()
            self._error = error
        finally:
            self.seconds = time.perf_counter() - start

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def match_sharpness_of(generated: np.ndarray, original: np.ndarray, region: np.ndarray, reference: np.ndarray,
                       sigma_px, target: float, seed: int = 0):
    """(generated stack with the input's intensity distribution, noise level and ``target`` x its
    sharpness in ``region``, details): :func:`AnonMRILib.transforms.appearance.match_sharpness`."""
    from ..transforms.appearance import match_sharpness

    if not region.any() or not reference.any():
        return generated, {}
    return match_sharpness(generated, original, region, reference, tuple(float(s) for s in sigma_px),
                           target_ratio=target, seed=seed)
