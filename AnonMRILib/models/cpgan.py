"""CP-GAN (Convex Privacy GAN, sec. 3.2 of the paper): conditional multi-scale 3-D GAN.

Notation: S = model size (32, 64 or 128), s = ``min_size`` = 4, N_B = log2(S/s) + 1 blocks,
scales ``s, 2s, ..., S`` (index 0 = coarsest). gamma(x) is the privacy transform
(3, S, S, S): channels [convex hull c, brain mask b, brain intensity b*x]
(:mod:`AnonMRILib.transforms.pooling` constants); ``gamma_k`` its pyramid level at scale k
(:func:`~AnonMRILib.transforms.pooling.privacy_pyramid`: binary channels by probabilistic
pooling, the intensity channel by average pooling). Intensities are in the privacy transform's
normalised unit (the image divided by its intensity scale); 0 is the background.

Generator  g_k = G^(k)(up(g_{k-1}), gamma_k), g_0 ~ N(0, 1) at s^3 drawn from a
           ``torch.Generator``. Each block: 3x3x3 stem on [previous image, gamma_k], a stack of
           inverted residuals, a 1x1x1 convolution to a single channel (the bottleneck between
           scales of Karras et al. 2019). Choice: from block 2 on the block's output is *added*
           to the upsampled previous image (StyleGAN2's "skip" generator); block 1 outputs its
           image directly (its input is noise). Upsampling is trilinear.
           Choice (position inputs; both on in the shipped weights): each block's stem also reads
           (a) the voxel's coordinates on the model grid (``generator_coordinates``, CoordConv,
           Liu et al. 2018) and (b) a learned positional embedding at the block's scale
           (``generator_position_channels`` channels, one parameter per voxel, initialised at 0;
           StyleGAN's learned constant input, ViT's learned position embedding). The model grid is
           the head's bounding box, so position says where in the head a voxel is (the face is
           anterior-inferior); the embedding is the same for every input and carries no patient
           information. Why: without them the small fine-scale blocks (receptive field 12-56 mm at
           S = 64) could not tell a face voxel from a scalp voxel; on a CPU budget a generator
           with coordinates alone still regressed to a featureless hull after 950 L1 steps, while
           with the embedding a nose, eye sockets and mouth appeared within 200 steps (scratch
           runs, README). ``generator_dilations`` optionally dilates the depthwise convolutions of
           the inverted residuals (larger receptive field at the same size).
Prior      (``prior="average_head"``; ours, the paper has none): G is conditioned on
           [gamma_k, T_k] and produces g_k = T_k + r_k, where T is the anatomical prior
           (:mod:`AnonMRILib.transforms.anatomical_prior`: an average head placed from gamma alone)
           average-pooled to scale k, and r_k the block chain's output (the residual; block 1
           reads noise, later blocks the upsampled previous residual). The residual's last
           convolution starts at 0, so an untrained generator returns T. Why: all realism was
           expected from a generator trained for an hour on a CPU on three heads at 4 mm; the
           prior brings a whole, smooth, natural head at the input's own resolution and the
           network only has to learn variation on it. The remodel pipeline adds the residual,
           brought back to the input grid and smoothed, to T at native resolution.
           ``prior="none"`` is the paper's generator.
Variation  (``prior_variation``, with the prior). ``"intensity"``: r_k is added to T_k, as above.
           ``"displacement"``: the block chain carries a 3-channel stationary velocity field v_k
           instead (model-grid axes, in units of half the grid's edge, so the same field means
           the same mm at every scale; bounded by ``max_velocity`` through a tanh; block 1 reads
           3-channel noise). It is smoothed with a Gaussian of one voxel at its scale (a smooth
           velocity keeps the discrete integration folding-free; without it a test saw a
           Jacobian of -0.45), faded to 0 within ``brain_margin_voxels`` model voxels of the
           brain mask (read from gamma_S, area-pooled to coarser scales), integrated by scaling
           and squaring (MONAI ``DVF2DDF``, 7 steps: a diffeomorphism, so no folds, holes or
           flaps) and T_k is warped with it (MONAI ``Warp``): g_k = T_k(x + u_k(x)). Why: the
           additive residual trained on synthetic people put lumps on cheeks and jaw and a flap
           under an ear (README); a warp can only move T's own tissue, so the skin keeps T's
           detail at the input's resolution and the network learns face *shape*. The remodel
           pipeline brings u_S to the input grid and warps T there. The shipped default
           weights (``cpgan_s64_prior``) are this variation, trained with the reconstruction L1
           kept off the face (:func:`face_region`; docs/cpgan/warp/).
Discriminator  d_1 = D^(1)(v_S, gamma_S), d_k = D^(k)(down(d_{k-1}), v_k, gamma_k), then a
           fully connected layer F to a scalar. Choice: the features passed between scales have
           several channels (the paper writes 1); down = 2x average pooling.
Brain preservation  f(gamma) = b*x + (1-b)*G(gamma); outside the convex hull the background
           (0). :func:`compose_pyramid` applies it at every scale, so the discriminator sees
           the composed fake against the real image under the same gamma.
Loss       relativistic, non-averaging least-squares GAN (RLSGAN, Jolicoeur-Martineau 2018,
           her "RSGAN with LS" form), each real paired with the fake made from *its own* gamma:
               L_D = E[(C(x_r) - C(x_f) - 1)^2],   L_G = E[(C(x_f) - C(x_r) - 1)^2].
           Why this form: the pairing compares a real head with a fake of the same brain and
           hull, so the critic judges the face, not the conditioning; the often quoted two-term
           "symmetric" version E[(C_r - C_f - 1)^2] + E[(C_f - C_r + 1)^2] is the same term twice
           (identical gradients up to a factor 2), so the single term is used.

All modules take and return (N, C, D, H, W) float tensors, coarsest scale first for pyramids.
"""
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn
import torch.nn.functional as F

from .blocks import LEAKY_SLOPE, convolution, inverted_residual_stack
from .model_card import JSONConfig

#: sizes S the model supports
SUPPORTED_SIZES = (16, 32, 64, 128)
#: the generator's conditioning beyond gamma: none (the paper) or the placed average head T(x)
PRIORS = ("none", "average_head")
#: how G varies the prior: an added intensity residual, or a diffeomorphic warp (module docstring)
PRIOR_VARIATIONS = ("intensity", "displacement")
#: scaling-and-squaring steps of the velocity field's integration
INTEGRATION_STEPS = 7
#: channels of gamma(x) (must match AnonMRILib.transforms.pooling.GAMMA_CHANNELS)
GAMMA_CHANNELS = 3
HULL_CHANNEL = 0
BRAIN_CHANNEL = 1
INTENSITY_CHANNEL = 2


def _default_widths(num_blocks: int, finest: int, coarsest: int) -> Tuple[int, ...]:
    """Channel widths from the coarsest to the finest scale, doubling per coarser scale, capped."""
    return tuple(min(coarsest, finest * 2 ** (num_blocks - 1 - k)) for k in range(num_blocks))


@dataclass(frozen=True)
class CPGANConfig(JSONConfig):
    """Architecture of CP-GAN. Widths/depths are per block, generator coarsest first.

    ``size``: S; ``min_size``: s (4); ``generator_channels[k]`` / ``generator_depths[k]``:
    channels and inverted-residual count of generator block k (scale s*2^k);
    ``discriminator_channels[k]`` / ``discriminator_depths[k]``: the same for discriminator
    block k, which works at scale S/2^k (finest first); ``expansion``: inverted-residual
    expansion factor; ``discriminator_spectral_norm``: spectral normalisation (Miyato et al.
    2018) of every discriminator convolution and of F. Choice: without it (and without
    normalisation layers) the relativistic LSGAN critic's scores blew up within 40 steps at the
    paper's learning rate; with it every critic weight is scale-invariant, which is exactly the
    case AdamP's projection is designed for. Empty tuples mean the defaults: widths ``finest_channels`` at S doubling
    per coarser scale up to ``coarsest_channels``; depths 0 at S, 1 at S/2 and 2 below, in
    both networks (a 3x3x3 stem still works at every scale). Choice for compute: at S = 64 one
    training step of batch 2 costs ~3.5 s on one CPU core with these, 3x more with full depth.
    ``generator_coordinates`` / ``generator_position_channels`` / ``generator_dilations``: the
    position inputs and dilated inverted residuals of the module docstring (off by default, so
    cards written before they existed load unchanged). ``prior``: "none" (the paper's generator)
    or "average_head" (G = T + residual, module docstring). ``prior_variation``: "intensity" or
    "displacement" (T warped by a diffeomorphism); ``max_velocity``: bound of the velocity field in
    units of half the model grid's edge (0.08 ~ 10 mm on a 250 mm grid); ``brain_margin_voxels``:
    the velocity is faded to 0 within this many model voxels of the brain.
    """

    size: int = 64
    min_size: int = 4
    gamma_channels: int = GAMMA_CHANNELS
    generator_channels: Tuple[int, ...] = ()
    generator_depths: Tuple[int, ...] = ()
    discriminator_channels: Tuple[int, ...] = ()
    discriminator_depths: Tuple[int, ...] = ()
    expansion: int = 2
    negative_slope: float = LEAKY_SLOPE
    finest_channels: int = 8
    coarsest_channels: int = 64
    discriminator_spectral_norm: bool = True
    generator_dilations: Tuple[int, ...] = ()
    generator_coordinates: bool = False
    generator_position_channels: int = 0
    prior: str = "none"
    prior_variation: str = "intensity"
    max_velocity: float = 0.08
    brain_margin_voxels: int = 2

    @property
    def uses_prior(self) -> bool:
        return self.prior != "none"

    @property
    def warps_prior(self) -> bool:
        """G warps the prior with a displacement field (rather than adding a residual)."""
        return self.uses_prior and self.prior_variation == "displacement"

    @property
    def image_channels(self) -> int:
        """Channels carried from block to block: 3 (a velocity field) when warping, else 1."""
        return 3 if self.warps_prior else 1

    def __post_init__(self) -> None:
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {', '.join(PRIORS)}, got {self.prior!r}")
        if self.prior_variation not in PRIOR_VARIATIONS:
            raise ValueError(f"prior_variation must be one of {', '.join(PRIOR_VARIATIONS)}, "
                             f"got {self.prior_variation!r}")
        if not float(self.max_velocity) > 0 or int(self.brain_margin_voxels) < 0:
            raise ValueError("max_velocity must be positive and brain_margin_voxels at least 0")
        if self.size not in SUPPORTED_SIZES or self.min_size < 1 or self.size % self.min_size:
            raise ValueError(f"CP-GAN size must be one of {SUPPORTED_SIZES} and a multiple of min_size")
        ratio = self.size // self.min_size
        if ratio & (ratio - 1):
            raise ValueError("size / min_size must be a power of two")
        n = self.num_blocks
        defaults = {
            "generator_channels": _default_widths(n, self.finest_channels, self.coarsest_channels),
            "generator_depths": tuple(0 if k == n - 1 else 1 if k == n - 2 else 2 for k in range(n)),
            "discriminator_channels": tuple(reversed(_default_widths(n, self.finest_channels,
                                                                     self.coarsest_channels))),
            "discriminator_depths": tuple(0 if k == 0 else 1 if k == 1 else 2 for k in range(n)),
        }
        for name, value in defaults.items():
            current = tuple(int(v) for v in getattr(self, name))
            if not current:
                current = value
            if len(current) != n:
                raise ValueError(f"{name} needs {n} entries (one per block), got {len(current)}")
            object.__setattr__(self, name, current)
        dilations = tuple(int(d) for d in self.generator_dilations)
        if any(d < 1 for d in dilations):
            raise ValueError("generator_dilations must be positive integers")
        if int(self.generator_position_channels) < 0:
            raise ValueError("generator_position_channels must be 0 (off) or positive")
        object.__setattr__(self, "generator_dilations", dilations)

    @property
    def num_blocks(self) -> int:
        """N_B = log2(S / s) + 1."""
        return int(round(math.log2(self.size / self.min_size))) + 1

    @property
    def scales(self) -> List[int]:
        """Edge lengths of the pyramid, coarsest first: s, 2s, ..., S."""
        return [self.min_size * 2 ** k for k in range(self.num_blocks)]


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last_3d)


def model_grid_coordinates(like: torch.Tensor) -> torch.Tensor:
    """(N, 3, k, k, k) voxel-centre coordinates of the model grid in [-1, 1], axis order of ``like``.

    The model grid is the head's bounding box (RAS axes), so a coordinate says where in the head a
    voxel lies (e.g. anterior-inferior = face); it carries no patient information.
    """
    axes = [torch.linspace(-1.0 + 1.0 / n, 1.0 - 1.0 / n, n, dtype=like.dtype, device=like.device)
            for n in like.shape[-3:]]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"))
    return grid.unsqueeze(0).expand(like.shape[0], -1, -1, -1, -1)


def smooth_field(field: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """Gaussian smoothing (``sigma`` in voxels, kernel radius 2 sigma, edges replicated) of every
    channel of ``field`` (N, C, D, H, W), separably. Used on the velocity field before its
    integration: a smooth velocity keeps the discrete scaling and squaring folding-free."""
    radius = max(1, int(round(2 * sigma)))
    offsets = torch.arange(-radius, radius + 1, dtype=field.dtype, device=field.device)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    channels = field.shape[1]
    out = field
    for axis in range(3):
        shape = [1, 1, 1]
        shape[axis] = kernel.numel()
        weight = kernel.reshape(1, 1, *shape).expand(channels, 1, *shape)
        padding = [0, 0, 0, 0, 0, 0]
        padding[2 * (2 - axis)] = padding[2 * (2 - axis) + 1] = radius
        out = F.conv3d(F.pad(out, padding, mode="replicate"), weight, groups=channels)
    return out


class GeneratorBlock(nn.Module):
    """G^(k): (previous image, gamma_k) -> image g_k at gamma_k's scale (``image_channels``
    channels: 1 for an image or residual, 3 for a velocity field)."""

    def __init__(self, gamma_channels: int, channels: int, depth: int, expansion: int,
                 negative_slope: float, skip: bool, dilations: Sequence[int] = (),
                 coordinates: bool = False, position_channels: int = 0, size: int = 0,
                 prior: bool = False, image_channels: int = 1) -> None:
        super().__init__()
        self.prior = bool(prior)
        self.skip = bool(skip)
        self.coordinates = bool(coordinates)
        self.position = None
        if position_channels > 0:
            self.position = nn.Parameter(torch.zeros(1, int(position_channels), size, size, size))
        inputs = (int(image_channels) + gamma_channels + (3 if self.coordinates else 0)
                  + max(0, int(position_channels)) + int(prior))
        self.stem = convolution(inputs, channels, kernel_size=3, negative_slope=negative_slope)
        self.body = inverted_residual_stack(channels, depth, expansion, negative_slope, dilations)
        self.to_image = convolution(channels, int(image_channels), kernel_size=1, activation=False)
        if self.prior:  # the residual starts at 0: an untrained generator returns the prior
            for parameter in self.to_image.parameters():
                nn.init.zeros_(parameter)

    def forward(self, previous: torch.Tensor, gamma_k: torch.Tensor, prior_k: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        if previous.shape[-3:] != gamma_k.shape[-3:]:
            previous = F.interpolate(previous, size=gamma_k.shape[-3:], mode="trilinear", align_corners=False)
        inputs = [previous, gamma_k]
        if self.prior:
            if prior_k is None:
                raise ValueError("this generator block is conditioned on the prior; pass prior_k")
            inputs.append(prior_k.to(gamma_k.dtype))
        if self.coordinates:
            inputs.append(model_grid_coordinates(gamma_k))
        if self.position is not None:
            inputs.append(self.position.to(gamma_k.dtype).expand(gamma_k.shape[0], -1, -1, -1, -1))
        features = self.body(self.stem(_channels_last(torch.cat(inputs, dim=1))))
        image = self.to_image(features)
        return previous + image if self.skip else image


class CPGANGenerator(nn.Module):
    """G_Phi: privacy pyramid [gamma_s, ..., gamma_S] -> fake pyramid [g_1, ..., g_NB] (N, 1, k, k, k)."""

    def __init__(self, config: CPGANConfig) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList([
            GeneratorBlock(config.gamma_channels, config.generator_channels[k], config.generator_depths[k],
                           config.expansion, config.negative_slope, skip=k > 0,
                           dilations=config.generator_dilations, coordinates=config.generator_coordinates,
                           position_channels=config.generator_position_channels, size=config.scales[k],
                           prior=config.uses_prior, image_channels=config.image_channels)
            for k in range(config.num_blocks)])
        self.integrate = self.warp = None
        if config.warps_prior:
            import warnings

            from monai.networks.blocks import DVF2DDF, Warp

            with warnings.catch_warnings():  # MONAI notes it uses torch's grid_sample
                warnings.simplefilter("ignore")
                self.integrate = DVF2DDF(num_steps=INTEGRATION_STEPS)
                self.warp = Warp(mode="bilinear", padding_mode="zeros")

    def sample_noise(self, batch: int, generator: Optional[torch.Generator] = None,
                     device: Optional[torch.device] = None) -> torch.Tensor:
        """g_0 ~ N(0, 1), shape (batch, C, s, s, s) (C = ``config.image_channels``), drawn on
        ``generator``'s device then moved."""
        s = self.config.min_size
        draw_device = generator.device if generator is not None else device
        noise = torch.randn((batch, self.config.image_channels, s, s, s), generator=generator, device=draw_device)
        return noise.to(device if device is not None else noise.device)

    def _brain_fades(self, gamma_pyramid: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Per scale (N, 1, k, k, k): 0 within ``brain_margin_voxels`` of the brain at S, rising to 1
        over one more voxel; area-pooled to the coarser scales."""
        finest = gamma_pyramid[-1][:, BRAIN_CHANNEL:BRAIN_CHANNEL + 1]
        margin = int(self.config.brain_margin_voxels)
        near = F.max_pool3d(finest, 2 * margin + 1, stride=1, padding=margin) if margin else finest
        fade = 1.0 - F.avg_pool3d(near, 3, stride=1, padding=1, count_include_pad=False)
        size = fade.shape[-1]
        return [fade if g.shape[-1] == size else F.avg_pool3d(fade, size // g.shape[-1]) for g in gamma_pyramid]

    def displacements(self, gamma_pyramid: Sequence[torch.Tensor], noise: Optional[torch.Tensor] = None,
                      generator: Optional[torch.Generator] = None,
                      prior_pyramid: Optional[Sequence[torch.Tensor]] = None) -> List[torch.Tensor]:
        """For ``prior_variation="displacement"``: the displacement fields u_k, (N, 3, k, k, k) in
        voxels of scale k along the model grid's axes (channel c = array axis c), coarsest first."""
        if not self.config.warps_prior:
            raise ValueError("this generator adds a residual; it has no displacement field")
        chain = self._block_chain(gamma_pyramid, noise, generator, prior_pyramid)
        bound = float(self.config.max_velocity)
        fields = []
        for raw, fade, gamma_k in zip(chain, self._brain_fades(gamma_pyramid), gamma_pyramid):
            velocity = smooth_field(bound * torch.tanh(raw / bound)) * fade * (gamma_k.shape[-1] / 2.0)
            fields.append(self.integrate(velocity))
        return fields

    def _block_chain(self, gamma_pyramid: Sequence[torch.Tensor], noise: Optional[torch.Tensor],
                     generator: Optional[torch.Generator],
                     prior_pyramid: Optional[Sequence[torch.Tensor]]) -> List[torch.Tensor]:
        """The blocks' outputs (images, residuals or raw velocities), coarsest first."""
        if len(gamma_pyramid) != self.config.num_blocks:
            raise ValueError(f"expected {self.config.num_blocks} gamma scales, got {len(gamma_pyramid)}")
        if self.config.uses_prior and (prior_pyramid is None or len(prior_pyramid) != self.config.num_blocks):
            raise ValueError(f"this generator is conditioned on the prior: pass {self.config.num_blocks} prior scales")
        priors = list(prior_pyramid) if self.config.uses_prior else [None] * self.config.num_blocks
        first = gamma_pyramid[0]
        if noise is None:
            noise = self.sample_noise(first.shape[0], generator, first.device)
        image = noise.to(first.dtype)
        chain = []
        for block, gamma_k, prior_k in zip(self.blocks, gamma_pyramid, priors):
            image = block(image, gamma_k, prior_k)
            chain.append(image)
        return chain

    def forward(self, gamma_pyramid: Sequence[torch.Tensor], noise: Optional[torch.Tensor] = None,
                generator: Optional[torch.Generator] = None,
                prior_pyramid: Optional[Sequence[torch.Tensor]] = None) -> List[torch.Tensor]:
        """Fake pyramid; with ``prior="average_head"`` each g_k = T_k + r_k, or T_k warped by u_k
        (``prior_pyramid``: :func:`image_pyramid` of T, coarsest first, (N, 1, k, k, k))."""
        if self.config.warps_prior:
            fields = self.displacements(gamma_pyramid, noise, generator, prior_pyramid)
            return [self.warp(prior_k.to(u.dtype), u).contiguous() for prior_k, u in zip(prior_pyramid, fields)]
        chain = self._block_chain(gamma_pyramid, noise, generator, prior_pyramid)
        priors = list(prior_pyramid) if self.config.uses_prior else [None] * self.config.num_blocks
        return [(image + prior_k if prior_k is not None else image).contiguous()
                for image, prior_k in zip(chain, priors)]



class DiscriminatorBlock(nn.Module):
    """D^(k): (down(d_{k-1}), v_k, gamma_k) -> features d_k at scale k."""

    def __init__(self, previous_channels: int, gamma_channels: int, channels: int, depth: int,
                 expansion: int, negative_slope: float) -> None:
        super().__init__()
        self.stem = convolution(previous_channels + 1 + gamma_channels, channels, kernel_size=3,
                                negative_slope=negative_slope)
        self.body = inverted_residual_stack(channels, depth, expansion, negative_slope)

    def forward(self, previous: Optional[torch.Tensor], image_k: torch.Tensor, gamma_k: torch.Tensor) -> torch.Tensor:
        inputs = [image_k, gamma_k]
        if previous is not None:
            if previous.shape[-3:] != image_k.shape[-3:]:
                previous = F.avg_pool3d(previous, 2)
            inputs.insert(0, previous)
        return self.body(self.stem(_channels_last(torch.cat(inputs, dim=1))))


class CPGANDiscriminator(nn.Module):
    """D_Theta: (image pyramid, gamma pyramid), both coarsest first -> one score per sample (N,)."""

    def __init__(self, config: CPGANConfig) -> None:
        super().__init__()
        self.config = config
        blocks = []
        previous = 0
        for k in range(config.num_blocks):
            blocks.append(DiscriminatorBlock(previous, config.gamma_channels, config.discriminator_channels[k],
                                             config.discriminator_depths[k], config.expansion,
                                             config.negative_slope))
            previous = config.discriminator_channels[k]
        self.blocks = nn.ModuleList(blocks)
        self.fully_connected = nn.Linear(previous * config.min_size ** 3, 1)
        if config.discriminator_spectral_norm:
            from torch.nn.utils.parametrizations import spectral_norm

            for module in list(self.modules()):
                if isinstance(module, (nn.Conv3d, nn.Linear)):
                    spectral_norm(module)

    def forward(self, image_pyramid: Sequence[torch.Tensor], gamma_pyramid: Sequence[torch.Tensor]) -> torch.Tensor:
        n = self.config.num_blocks
        if len(image_pyramid) != n or len(gamma_pyramid) != n:
            raise ValueError(f"expected {n} scales of images and gamma")
        features = None
        # finest scale first: block k works at S / 2^k
        for k, block in enumerate(self.blocks):
            features = block(features, image_pyramid[n - 1 - k], gamma_pyramid[n - 1 - k])
        flat = features.contiguous().reshape(features.shape[0], -1)
        return self.fully_connected(flat).reshape(-1)


# --- pyramids, brain preservation and losses -------------------------------------------------

def image_pyramid(image: torch.Tensor, scales: Sequence[int]) -> List[torch.Tensor]:
    """Average-pooled copies of ``image`` (N, 1, S, S, S) at ``scales`` (coarsest first)."""
    size = image.shape[-1]
    return [image if scale == size else F.avg_pool3d(image, size // scale) for scale in scales]


def compose_preserving(generated: torch.Tensor, image: torch.Tensor, gamma: torch.Tensor,
                       background: float = 0.0) -> torch.Tensor:
    """f = c * (b*x + (1-b)*g) + (1-c) * background, with c, b read from ``gamma`` (N, 3, k, k, k)."""
    hull = gamma[:, HULL_CHANNEL:HULL_CHANNEL + 1]
    brain = gamma[:, BRAIN_CHANNEL:BRAIN_CHANNEL + 1]
    inside = brain * image + (1.0 - brain) * generated
    return hull * inside + (1.0 - hull) * background


def compose_pyramid(generated: Sequence[torch.Tensor], images: Sequence[torch.Tensor],
                    gammas: Sequence[torch.Tensor], background: float = 0.0) -> List[torch.Tensor]:
    """:func:`compose_preserving` at every scale (the discriminator's fake pyramid)."""
    return [compose_preserving(g, x, c, background) for g, x, c in zip(generated, images, gammas)]


def mask_to_hull(images: Sequence[torch.Tensor], gammas: Sequence[torch.Tensor],
                 background: float = 0.0) -> List[torch.Tensor]:
    """Real pyramid with everything outside the hull set to the background (as the fakes are)."""
    return [g[:, HULL_CHANNEL:HULL_CHANNEL + 1] * x + (1.0 - g[:, HULL_CHANNEL:HULL_CHANNEL + 1]) * background
            for x, g in zip(images, gammas)]


def discriminator_loss(real_scores: torch.Tensor, fake_scores: torch.Tensor) -> torch.Tensor:
    """Relativistic non-averaging LSGAN critic loss E[(C(x_r) - C(x_f) - 1)^2] (paired)."""
    return ((real_scores - fake_scores - 1.0) ** 2).mean()


def generator_loss(real_scores: torch.Tensor, fake_scores: torch.Tensor) -> torch.Tensor:
    """Relativistic non-averaging LSGAN generator loss E[(C(x_f) - C(x_r) - 1)^2] (paired)."""
    return ((fake_scores - real_scores - 1.0) ** 2).mean()


def face_region(gamma: torch.Tensor, front_fraction: float = 0.5) -> torch.Tensor:
    """(N, 1, k, k, k) 1 where a voxel lies in front of the brain: model axis j (posterior ->
    anterior) beyond the brain's centroid plus ``front_fraction`` of the way to its most anterior
    voxel (per sample; read from gamma's brain channel). Covers forehead, eyes, nose, mouth, chin."""
    brain = gamma[:, BRAIN_CHANNEL:BRAIN_CHANNEL + 1]
    j = torch.arange(brain.shape[-2], dtype=brain.dtype, device=brain.device)
    profile = brain.sum(dim=(1, 2, 4))  # (N, k): brain voxels per coronal plane
    centroid = (profile * j).sum(dim=1) / profile.sum(dim=1).clamp_min(1.0)
    front = torch.where(profile > 0, j, torch.full_like(profile, -1)).amax(dim=1)
    threshold = centroid + front_fraction * (front - centroid)
    return (j.reshape(1, 1, 1, -1, 1) > threshold.reshape(-1, 1, 1, 1, 1)).to(brain.dtype).expand_as(brain)


def remodel_region_l1(generated: Sequence[torch.Tensor], images: Sequence[torch.Tensor],
                      gammas: Sequence[torch.Tensor], exclude_face: bool = False) -> List[torch.Tensor]:
    """Per-scale mean |g_k - x_k| over the remodeled region (inside the hull, outside the brain;
    with ``exclude_face`` also outside :func:`face_region`).

    Logged at every scale; optionally added to the generator loss (see the training script):
    it pulls G towards the conditional mean head given gamma. Excluding the face keeps that pull
    (towards the training head's own face, which its hull implies) off the face.
    """
    losses = []
    for g, x, c in zip(generated, images, gammas):
        region = c[:, HULL_CHANNEL:HULL_CHANNEL + 1] * (1.0 - c[:, BRAIN_CHANNEL:BRAIN_CHANNEL + 1])
        if exclude_face:
            region = region * (1.0 - face_region(c))
        losses.append((region * (g - x).abs()).sum() / region.sum().clamp_min(1.0))
    return losses


def count_parameters(module: nn.Module) -> int:
    return int(sum(p.numel() for p in module.parameters()))
