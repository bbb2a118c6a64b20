"""Evaluate the lesion method on the donor-brain prior on real lesion scans that took no part in anything.

Cases (pyradiomics 3.0.1 source archive, ``data/``: post-contrast T1, 0.78 x 0.78 x 6.5 mm, labelled
lesion; neither is a donor nor a training head):

* ``brain1``, ``brain2``: whole heads, each face method of ``--face-method`` (comma-separated,
  default reface) and ``none``;
* ``brain1_stripped``, ``brain2_stripped``: the same skull-stripped with their brain mask;
* ``brats_like``: a BraTS-style skull-stripped four-contrast case built from brain2: T1c is the
  scan; T1 is T1c with its enhancing tail clipped to the tail threshold; T2 and FLAIR are rendered
  from brain2's own tissue memberships (CSF/grey/white means of typical T2 and FLAIR contrasts, the
  scan's within-tissue texture, the lesion bright) -- real anatomy, synthetic contrasts, one grid;
* ``strengths`` (not in the default list): brain1 skull-stripped at learned-variation strengths
  :data:`STRENGTHS` side by side (``variation_strengths.png``), with each output's NCC with the placed
  donor alone (strength 0) and the metrics below.

Per output (lesion excluded where it says so): mean in-plane gradient magnitude output / input inside
the brain's interior (eroded 2 px in-plane) and inside the Otsu head, the head's also after a
1-pixel in-plane Gaussian on both (edges, not pixel noise: :func:`smoothed_gradient_ratio`); head
outline Dice, of the 3-D Otsu head masks and of each slice's outline (:func:`slice_outline_dice`); lesion
bit-exact; the fraction of non-lesion brain voxels changed; adjacent-slice correlation of the
brain (output vs input); gradient-magnitude profiles across the brain-mask edge and the lesion
boundary (-4 .. +4 px in-plane, output vs input); normalised cross-correlation inside the brain of
the output with its own input and with the other patient's input (affinely registered, Mattes MI),
and the input's own with the other patient's (how alike two different brains are), also on the
interior only (deeper than 5 mm: the brain's outline is kept by design and makes any brain placed in
it correlate with the patient's rim); the same two comparisons made fair in two ways -- the scanner's
shading removed from every scan first (N4 inside the brain: a receive field is not anatomy, and on a
thick-slice clinical scan it rules the low spatial frequencies), and the other patient's brain placed
on this patient from the masks alone, exactly as a donor is (any brain given this outline shares the
output's layout); adjacent-slice correlation inside the brain also after N4; NCC of the
output with each donor (rendered in the patient's contrast, affinely registered) next to a re-scan
of that donor (the donor placed, resampled with a 1 mm / 1 degree rigid move, the patient's noise,
registered back); time. Figures: several slices per case, before / after.

    python Training/evaluate_lesion_prior.py --pyradiomics DATA/pyradiomics-3.0.1/data \\
        --out docs/evaluation/lesion/prior --seed 0
"""
import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def in_plane(array, layout):
    """(N, H, W) slices along the axial axis, RAS-ordered."""
    from AnonMRILib.pipelines.lesion import to_ras_layout

    return np.moveaxis(to_ras_layout(np.asarray(array), *layout), -1, 0)


def gradient_magnitude(stack):
    rows, cols = np.gradient(np.asarray(stack, dtype=np.float64), axis=(1, 2))
    return np.sqrt(rows ** 2 + cols ** 2)


def eroded(stack, px):
    from scipy import ndimage

    structure = np.zeros((3, 3, 3), bool)
    structure[1] = ndimage.generate_binary_structure(2, 1)
    return ndimage.binary_erosion(stack, structure=structure, iterations=px) if px else stack


def signed_in_plane_distance(mask_stack):
    """Signed in-plane distance (px) to the mask's edge per slice: positive outside."""
    from scipy import ndimage

    out = np.zeros(mask_stack.shape, np.float32)
    for k, mask in enumerate(mask_stack):
        if mask.any() and (~mask).any():
            out[k] = ndimage.distance_transform_edt(~mask) - ndimage.distance_transform_edt(mask)
    return out


def edge_profile(image, output, mask_stack, region, radius=4):
    """Mean gradient magnitude by signed in-plane distance to the edge of ``mask_stack``, in ``region``."""
    distance = np.round(signed_in_plane_distance(mask_stack))
    g_in, g_out = gradient_magnitude(image), gradient_magnitude(output)
    rows = []
    for d in range(-radius, radius + 1):
        where = (distance == d) & region
        if where.sum() < 20:
            continue
        rows.append({"distance_px": d, "input": round(float(g_in[where].mean()), 2),
                     "output": round(float(g_out[where].mean()), 2)})
    ring = [r for r in rows if abs(r["distance_px"]) <= 1]
    ratio = float(np.mean([r["output"] for r in ring]) / max(np.mean([r["input"] for r in ring]), 1e-9)) if ring else None
    return {"profile": rows, "ring_gradient_ratio": None if ratio is None else round(ratio, 3)}


def interior_adjacent_correlation(stack, brain_stack, lesion_stack, min_pixels=100):
    """Mean correlation of each slice with the next over the pixels with brain, and no lesion, in both
    (the outline, which the union-of-foreground measure of
    :func:`AnonMRILib.evaluation.volume_consistency.adjacent_slice_correlation` mixes in, left out)."""
    values = []
    for k in range(len(stack) - 1):
        region = brain_stack[k] & brain_stack[k + 1] & ~lesion_stack[k] & ~lesion_stack[k + 1]
        if region.sum() >= min_pixels:
            values.append(np.corrcoef(stack[k][region], stack[k + 1][region])[0, 1])
    return float(np.nanmean(values)) if values else float("nan")


def ncc(a, b, mask):
    x, y = np.asarray(a, np.float64)[mask], np.asarray(b, np.float64)[mask]
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / max(np.sqrt((x ** 2).sum() * (y ** 2).sum()), 1e-12))


def affine_to(fixed, moving, fixed_mask=None):
    """``moving`` (Volume) registered affinely onto ``fixed``'s grid (Mattes MI, moments start)."""
    import SimpleITK as sitk

    from AnonMRILib.io.readers import simpleitk_to_numpy
    from AnonMRILib.io.writers import numpy_to_simpleitk

    f = numpy_to_simpleitk(np.asarray(fixed.array, np.float32), fixed.affine)
    m = numpy_to_simpleitk(np.asarray(moving.array, np.float32), moving.affine)
    initial = sitk.CenteredTransformInitializer(f, m, sitk.AffineTransform(3),
                                                sitk.CenteredTransformInitializerFilter.MOMENTS)
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(32)
    method.SetMetricSamplingStrategy(method.REGULAR)
    method.SetMetricSamplingPercentage(0.2, 1)
    method.SetInterpolator(sitk.sitkLinear)
    method.SetOptimizerAsRegularStepGradientDescent(1.0, 1e-3, 100, relaxationFactor=0.6)
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetShrinkFactorsPerLevel([4, 2, 1])
    method.SetSmoothingSigmasPerLevel([2, 1, 0])
    method.SetInitialTransform(initial, inPlace=False)
    method.SetNumberOfThreads(1)
    transform = method.Execute(f, m)
    return simpleitk_to_numpy(sitk.Resample(m, f, transform, sitk.sitkLinear, 0.0, sitk.sitkFloat32))[0]


def skull_stripped(volume, brain):
    return volume.with_array(np.where(brain, np.asarray(volume.array), 0).astype(volume.dtype))


def brats_like(volume, brain, lesion):
    """(T1, T1c, T2, FLAIR) Volumes from one skull-stripped post-contrast scan (module docstring)."""
    from AnonMRILib.transforms.brain_prior import bright_tail_threshold, classify_patient_tissues

    t1c = skull_stripped(volume, brain)
    data = np.asarray(t1c.array, np.float64)
    tissues = classify_patient_tissues(t1c, brain, lesion, "T1c")
    threshold = bright_tail_threshold(data[tissues.labels > 0], 4.0)
    t1 = np.where(brain & ~lesion, np.minimum(data, threshold), data)
    csf, grey, white = tissues.memberships
    values = data[tissues.classified]
    texture = (values - values.mean()) / values.std()
    contrasts = {"T2": (1500.0, 800.0, 600.0, 1300.0), "FLAIR": (150.0, 700.0, 520.0, 1000.0)}
    out = {"T1": t1c.with_array(np.round(t1).astype(np.int16)), "T1c": t1c}
    for name, (c, g, w, les) in contrasts.items():
        image = np.zeros(volume.shape)
        image[tissues.classified] = c * csf + g * grey + w * white + 25.0 * texture
        margin = brain & ~lesion & ~tissues.classified
        image[margin | (brain & (tissues.labels == 4))] = g
        image[lesion] = les + 0.2 * (data[lesion] - data[lesion].mean())
        out[name] = t1c.with_array(np.round(np.where(brain, np.clip(image, 0, None), 0)).astype(np.int16))
    return out


def placed_by_masks(image, brain, lesion, other, other_brain, seed):
    """The other patient's (skull-stripped) brain placed on this patient exactly as a donor is: from
    the two brain masks and the lesion mask alone (affine + demons on distance maps, variation, mass
    effect), slab-averaged onto ``image``'s grid -- what any brain given this outline looks like."""
    from AnonMRILib.transforms import brain_prior as bp

    donor = bp.Donor("other_patient", other, other.with_array(other_brain.astype(np.uint8)), None, None, {})
    config = bp.BrainPriorConfig()
    placement = bp.place_brain_prior(image.with_array(brain.astype(np.uint8)), image.with_array(lesion.astype(np.uint8)),
                                     seed, config, bank=[donor])
    return bp.resample_placed(placement, np.asarray(other.array), image, brain, config)


def mask_dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice of two boolean arrays, 4 decimals (0 when both are empty)."""
    return round(2.0 * float((a & b).sum()) / max(float(a.sum() + b.sum()), 1.0), 4)


def slice_outline_dice(head_in: np.ndarray, head_out: np.ndarray) -> float:
    """Dice of the head outlines slice by slice: each slice's head mask (N, H, W stacks) with its
    holes filled in-plane. The 3-D mask's hole filling leaves out every dark region that reaches the
    air around the head (sinuses, airway, mastoid and the dark skull, through the nostrils, mouth and
    ear canals; closing the grid's cut faces first moves brain1's figure by 0.002), so its Dice also
    counts dark cavities inside the head: with the face kept (``none``) and only the brain changed,
    brain1's 3-D Dice is 0.971, its outline Dice 0.987."""
    from scipy import ndimage

    fill = lambda m: np.stack([ndimage.binary_fill_holes(s) for s in m])  # noqa: E731
    return mask_dice(fill(head_in), fill(head_out))


#: in-plane Gaussian (pixels) that removes pixel noise before the structure-only gradient ratio
STRUCTURE_SIGMA_PX = 1.0


def smoothed_gradient_ratio(s_in: np.ndarray, s_out: np.ndarray, region: np.ndarray) -> float:
    """Mean in-plane gradient magnitude of output / input in ``region`` after an in-plane Gaussian of
    :data:`STRUCTURE_SIGMA_PX` on both: edges, not pixel noise (added noise alone cannot pass it)."""
    from scipy import ndimage

    from AnonMRILib.transforms.appearance import mean_gradient

    blur = lambda s: ndimage.gaussian_filter(s, (0.0, STRUCTURE_SIGMA_PX, STRUCTURE_SIGMA_PX))  # noqa: E731
    return round(mean_gradient(blur(s_out), region) / max(mean_gradient(blur(s_in), region), 1e-12), 3)


def metrics(image, output, brain, lesion, layout, others=(), output_brain=None, seed=0):
    """The per-output figures of the module docstring; ``others``: [(name, other patient Volume
    skull-stripped, its brain mask)];
    ``output_brain``: the output's brain when its outline is not the input's (a skull-stripped input gets
    the donor's): the brain figures then use the voxels with brain in both, and the outline Dice is
    reported as ``brain_outline_dice``."""
    from AnonMRILib.evaluation.volume_consistency import adjacent_slice_correlation
    from AnonMRILib.transforms.appearance import mean_gradient
    from AnonMRILib.transforms.bias_field import n4_corrected
    from AnonMRILib.transforms.head_mask import head_mask_array

    from scipy import ndimage

    a, b = np.asarray(image.array), np.asarray(output.array)
    outline_dice = None
    if output_brain is not None:
        outline_dice = mask_dice(brain, output_brain)
        brain = brain & output_brain
    deep = ndimage.distance_transform_edt(brain, sampling=image.spacing) > 5.0  # the outline (kept) left out
    head_in, head_out = head_mask_array(a), head_mask_array(b)
    s_in, s_out = in_plane(a, layout).astype(np.float64), in_plane(b, layout).astype(np.float64)
    s_brain, s_lesion = in_plane(brain, layout), in_plane(lesion, layout)
    interior = eroded(s_brain, 2) & ~s_lesion
    s_head = in_plane(head_in, layout)
    scale = float(np.percentile(a[brain], 99.5)) or 1.0
    consistent = lambda s: float(np.nanmean(adjacent_slice_correlation(np.where(s_brain, s / scale, 0.0))))  # noqa
    figures = {
        "gradient_ratio_brain_interior": round(mean_gradient(s_out, interior) / mean_gradient(s_in, interior), 3),
        "gradient_ratio_brain": round(mean_gradient(s_out, s_brain & ~s_lesion) / mean_gradient(s_in, s_brain & ~s_lesion), 3),
        "gradient_ratio_head": round(mean_gradient(s_out, s_head & ~s_lesion) / mean_gradient(s_in, s_head & ~s_lesion), 3),
        "head_outline_dice": mask_dice(head_in, head_out),
        "head_outline_dice_slices": slice_outline_dice(in_plane(head_in, layout), in_plane(head_out, layout)),
        "gradient_ratio_head_smoothed": smoothed_gradient_ratio(s_in, s_out, s_head & ~s_lesion),
        "lesion_bit_exact": bool(np.array_equal(a[lesion], b[lesion])),
        "changed_fraction_non_lesion_brain": round(float((a != b)[brain & ~lesion].mean()), 4),
        "adjacent_slice_correlation": {"input": round(consistent(s_in), 3), "output": round(consistent(s_out), 3)},
        "brain_edge": edge_profile(s_in, s_out, s_brain, ~s_lesion),
        "lesion_edge": edge_profile(s_in, s_out, s_lesion, s_brain) if lesion.any() else None,
        "ncc_output_own_input": round(ncc(a, b, brain & ~lesion), 3),
        "ncc_output_own_input_interior": round(ncc(a, b, deep & ~lesion), 3),
        "adjacent_slice_correlation_inside_brain": {"input": round(interior_adjacent_correlation(s_in, s_brain, s_lesion), 3),
                                                    "output": round(interior_adjacent_correlation(s_out, s_brain, s_lesion), 3)},
    }
    if outline_dice is not None:
        figures["brain_outline_dice"] = outline_dice
    # the same with the scanner's shading removed (N4 inside the brain): not anatomy, and it rules the
    # low spatial frequencies of a thick-slice clinical scan (brain1's field: 0.67-1.03)
    a_n4 = np.asarray(n4_corrected(image, brain).array, np.float64)
    b_n4 = np.asarray(n4_corrected(output, brain).array, np.float64)
    figures["adjacent_slice_correlation_inside_brain_n4"] = {
        "input": round(interior_adjacent_correlation(in_plane(a_n4, layout), s_brain, s_lesion), 3),
        "output": round(interior_adjacent_correlation(in_plane(b_n4, layout), s_brain, s_lesion), 3)}
    figures["ncc_output_own_input_n4"] = round(ncc(a_n4, b_n4, brain & ~lesion), 3)
    for name, other, other_brain in others:
        aligned = affine_to(skull_stripped(image, brain), other)
        figures[f"ncc_output_{name}"] = round(ncc(b, aligned, brain & ~lesion), 3)
        figures[f"ncc_input_{name}"] = round(ncc(a, aligned, brain & ~lesion), 3)
        figures[f"ncc_output_{name}_interior"] = round(ncc(b, aligned, deep & ~lesion), 3)
        other_n4 = n4_corrected(other, other_brain)
        aligned_n4 = affine_to(image.with_array(np.where(brain, a_n4, 0.0).astype(np.float32)), other_n4)
        figures[f"ncc_output_{name}_n4"] = round(ncc(b_n4, aligned_n4, brain & ~lesion), 3)
        figures[f"ncc_input_{name}_n4"] = round(ncc(a_n4, aligned_n4, brain & ~lesion), 3)
        placed = placed_by_masks(image, brain, lesion, other, other_brain, seed)
        figures[f"ncc_output_{name}_placed_by_masks"] = round(ncc(b, placed, brain & ~lesion), 3)
        figures[f"ncc_input_{name}_placed_by_masks"] = round(ncc(a, placed, brain & ~lesion), 3)
    return figures


def donor_distances(image, output, brain, lesion, config, seed):
    """NCC after affine registration of the output with each donor (rendered in the patient's
    contrast), and of a re-scan of that donor with the donor (module docstring)."""
    import SimpleITK as sitk

    from AnonMRILib.io import Volume
    from AnonMRILib.io.readers import simpleitk_to_numpy
    from AnonMRILib.io.writers import numpy_to_simpleitk
    from AnonMRILib.transforms.appearance import estimate_noise_sigma
    from AnonMRILib.transforms import brain_prior as bp

    tissues = bp.classify_patient_tissues(image, brain, lesion, "auto", config)
    statistics = bp.tissue_statistics(image, tissues, config, bright_tail=False)
    stripped = skull_stripped(output, brain)
    rows = {}
    for donor in bp.load_donor_bank(config):
        for mirror in (False, True):
            d = bp.mirrored(donor) if mirror else donor
            rendered = bp.render_donor(d, statistics, config, seed)
            rendered = rendered.with_array(np.where(np.asarray(d.brain.array) != 0, rendered.array, 0).astype(np.float32))
            to_output = affine_to(stripped, rendered)
            # re-scan: the donor placed affinely on the patient's grid, moved 1 mm / 1 degree, with the
            # patient's noise, then registered back onto the donor placed without the move
            placed = Volume(affine_to(stripped, rendered), image.affine)
            moved_t = sitk.Euler3DTransform()
            moved_t.SetCenter(numpy_to_simpleitk(np.zeros((2, 2, 2), np.float32), image.affine).TransformContinuousIndexToPhysicalPoint(
                [s / 2 for s in image.shape]))
            moved_t.SetRotation(np.deg2rad(1.0), 0.0, np.deg2rad(0.5))
            moved_t.SetTranslation((1.0, 0.0, 0.0))
            ref = numpy_to_simpleitk(np.asarray(placed.array, np.float32), image.affine)
            moved = simpleitk_to_numpy(sitk.Resample(ref, ref, moved_t, sitk.sitkLinear, 0.0, sitk.sitkFloat32))[0]
            slice_axis = int(np.argmax(np.asarray(image.spacing)))
            sigma = estimate_noise_sigma(np.moveaxis(np.asarray(image.array, np.float64), slice_axis, 0),
                                         np.moveaxis(brain & ~lesion, slice_axis, 0))
            noisy = moved + sigma * np.random.default_rng(seed).standard_normal(moved.shape) * (moved > 0)
            rescan = affine_to(placed, Volume(noisy.astype(np.float32), image.affine))
            region = brain & ~lesion & (np.asarray(placed.array) > 0)
            rows[d.name] = {"ncc_output_donor": round(ncc(output.array, to_output, brain & ~lesion), 3),
                            "ncc_rescan_donor": round(ncc(placed.array, rescan, region), 3)}
    return rows


def draw_figure(path, columns, lesion, layout, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s_lesion = in_plane(lesion, layout)
    counts = s_lesion.reshape(len(s_lesion), -1).sum(1)
    centre = int(np.argmax(counts))
    brain_slices = np.flatnonzero(in_plane(np.asarray(columns[0][1]) > 0, layout).reshape(len(s_lesion), -1).any(1))
    picks = sorted({int(np.clip(k, brain_slices.min(), brain_slices.max()))
                    for k in (centre - 6, centre - 3, centre, centre + 3, centre + 6)})
    fig, axes = plt.subplots(len(columns), len(picks), figsize=(2.6 * len(picks), 2.7 * len(columns)), squeeze=False)
    vmax = 1.0
    for row, (name, data) in enumerate(columns):
        stack = in_plane(data, layout).astype(np.float64)
        if "output" not in name:  # an output row is shown in its input's range
            vmax = float(np.percentile(stack[stack > 0], 99.5)) if (stack > 0).any() else 1.0
        for col, k in enumerate(picks):
            ax = axes[row, col]
            ax.imshow(stack[k].T, cmap="gray", origin="lower", vmin=0, vmax=vmax, interpolation="nearest")
            if row == 0 and s_lesion[k].any():
                ax.contour(s_lesion[k].T, levels=[0.5], colors="r", linewidths=0.5)
            ax.set_title(f"{name}, slice {k}", fontsize=7)
            ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (2.7 * len(columns))))
    save_palette_png(fig, path)
    plt.close(fig)


def save_palette_png(fig, path, dpi: int = 80) -> None:
    """``fig`` as a 256-colour palette PNG (the grey slices and the red lesion outline need no more):
    half the bytes of matplotlib's RGBA, which the repository keeps in its history."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(256).save(path, format="PNG", optimize=True)


#: strengths of the learned variation shown side by side by the ``strengths`` case
STRENGTHS = (0.0, 0.3, 0.6, 1.0)


def main(argv=None) -> int:
    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig, anonymize_lesion_contrasts, axial_layout
    from AnonMRILib.transforms.brain_mask import brain_mask

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pyradiomics", type=Path, required=True, help="pyradiomics-3.0.1/data")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--face-method", default="reface",
                        help="face method(s) outside the brain for the whole heads, comma-separated (and always none)")
    parser.add_argument("--cases", default="brain1,brain2,brain1_stripped,brain2_stripped,brats_like")
    parser.add_argument("--variation", type=float, default=None,
                        help="strength of the learned variation (default: the library's)")
    parser.add_argument("--weights", type=Path, default=None, help="lesion prior weights folder (default: shipped)")
    parser.add_argument("--slice-thickness", type=float, default=None, metavar="MM",
                        help="the scans' slice thickness for the donor's slab (default: their spacing, 6.5 mm)")
    parser.add_argument("--results-name", default="results.json")
    parser.add_argument("--no-figures", action="store_true", help="figures not drawn (a side run)")
    args = parser.parse_args(argv)
    from AnonMRILib.pipelines.prior_variation import PriorVariationConfig
    from AnonMRILib.transforms.brain_prior import BrainPriorConfig

    variation = PriorVariationConfig() if args.variation is None else PriorVariationConfig(strength=args.variation)
    prior = BrainPriorConfig(slice_thickness_mm=args.slice_thickness)

    def lesion_config(**settings):
        return LesionAnonymizationConfig(variation=variation, brain_prior=prior, **settings)

    def figure(*figure_args):
        if not args.no_figures:
            draw_figure(*figure_args)
    args.out.mkdir(parents=True, exist_ok=True)
    scans = {}
    for name in ("brain1", "brain2"):
        image = load_volume(args.pyradiomics / f"{name}_image.nrrd")
        lesion = np.asarray(load_volume(args.pyradiomics / f"{name}_label.nrrd").array) != 0
        start = time.time()
        mask = brain_mask(image)
        scans[name] = (image, lesion, (np.asarray(mask.array) != 0) | lesion, mask, time.time() - start)
    results = {"seed": args.seed, "cases": {}}
    wanted = args.cases.split(",")
    for case in wanted:
        base = case.split("_")[0] if case not in ("brats_like", "strengths") else \
            ("brain2" if case == "brats_like" else "brain1")
        image, lesion, brain, mask, mask_s = scans[base]
        other_name = "brain2" if base == "brain1" else "brain1"
        other = (skull_stripped(scans[other_name][0], scans[other_name][2]), scans[other_name][2])
        layout = axial_layout(image.affine)
        lesion_volume = image.with_array(lesion.astype(np.uint8))
        if case in ("brain1", "brain2"):
            runs, columns = {}, [("input", image.array)]
            for method in [*args.face_method.split(","), "none"]:
                config = lesion_config(exact_lesion=True, face_method=method, input_kind="head")
                start = time.time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    (output,), details = anonymize_lesion_contrasts([image], lesion_volume, None, config,
                                                                    weights=args.weights, seed=args.seed,
                                                                    brain_mask=mask)
                seconds = time.time() - start
                runs[method] = {"seconds_with_given_mask": round(seconds, 1), "brain_mask_seconds": round(mask_s, 1),
                                **details, **metrics(image, output, brain, lesion, layout,
                                                     [("other_patient", *other)] if method == "none" else [], seed=args.seed)}
                if method == "none":
                    runs[method]["donor_distances"] = donor_distances(image, output, brain, lesion,
                                                                      config.brain_prior, args.seed)
                columns.append((f"output ({method})", output.array))
                print(case, method, json.dumps(runs[method])[:600], flush=True)
            figure(args.out / f"{case}.png", columns, lesion, layout, f"{case}: whole head, exact lesion, seed {args.seed}")
            results["cases"][case] = runs
        elif case.endswith("_stripped"):
            stripped = skull_stripped(image, brain)
            config = lesion_config(exact_lesion=True, input_kind="brain")
            start = time.time()
            (output,), details = anonymize_lesion_contrasts([stripped], lesion_volume, None, config, seed=args.seed,
                                                            weights=args.weights, brain_mask=mask)
            run = {"seconds": round(time.time() - start, 1), **details,
                   **metrics(stripped, output, brain, lesion, layout, [("other_patient", *other)], seed=args.seed,
                             output_brain=np.asarray(output.array) > np.asarray(stripped.array).min())}
            config_latent = lesion_config(exact_lesion=False, input_kind="brain")
            (latent_output,), _ = anonymize_lesion_contrasts([stripped], lesion_volume, None, config_latent,
                                                             seed=args.seed, weights=args.weights, brain_mask=mask)
            run["lesion_from_latent"] = metrics(stripped, latent_output, brain, lesion, layout, output_brain=np.asarray(
                latent_output.array) > np.asarray(stripped.array).min())
            results["cases"][case] = run
            print(case, json.dumps(run)[:600], flush=True)
            figure(args.out / f"{case}.png", [("input", stripped.array), ("output, exact lesion", output.array),
                                              ("output, lesion from its latent", latent_output.array)],
                   lesion, layout, f"{case}: skull-stripped, seed {args.seed}")
        elif case == "strengths":
            stripped = skull_stripped(image, brain)
            run, columns, placed = {}, [("input", stripped.array)], None
            for strength in STRENGTHS:
                config = LesionAnonymizationConfig(exact_lesion=True, input_kind="brain", brain_prior=prior,
                                                   variation=PriorVariationConfig(strength=strength))
                (output,), _ = anonymize_lesion_contrasts([stripped], lesion_volume, None, config, seed=args.seed,
                                                          weights=args.weights, brain_mask=mask)
                data = np.asarray(output.array, np.float64)
                placed = data if placed is None else placed
                inside = brain & ~lesion & (data > 0) & (placed > 0)
                run[str(strength)] = {"ncc_with_placed_donor": round(ncc(data, placed, inside), 3),
                                      **metrics(stripped, output, brain, lesion, layout, output_brain=data > 0)}
                columns.append((f"output, variation {strength}", output.array))
                print(case, strength, run[str(strength)]["ncc_with_placed_donor"], flush=True)
            results["cases"][case] = run
            figure(args.out / "variation_strengths.png", columns, lesion, layout,
                   f"{base}, skull-stripped: strength of the learned variation, seed {args.seed}")
        else:
            contrasts = brats_like(image, brain, lesion)
            names = list(contrasts)
            config = lesion_config(exact_lesion=True, input_kind="brain")
            start = time.time()
            outputs, details = anonymize_lesion_contrasts([contrasts[n] for n in names], lesion_volume,
                                                          ["T1c", "T1w", "T2w", "FLAIR"] if names[0] == "T1c" else
                                                          ["T1w", "T1c", "T2w", "FLAIR"], config, seed=args.seed,
                                                          weights=args.weights, brain_mask=mask)
            run = {"seconds_four_contrasts": round(time.time() - start, 1), **details, "contrasts_figures": {}}
            from AnonMRILib.transforms.brain_prior import classify_patient_tissues

            output_brain = np.asarray(outputs[0].array) > 0
            reference_tissues = classify_patient_tissues(outputs[0], output_brain, lesion, "T1w")
            csf_out, white_out = reference_tissues.labels == 1, reference_tissues.labels == 3
            for name, output in zip(names, outputs):
                source = contrasts[name]
                figs = metrics(source, output, brain, lesion, layout, output_brain=output_brain)
                out_data = np.asarray(output.array, np.float64)
                figs["csf_over_white_output"] = round(float(np.median(out_data[csf_out]) / np.median(out_data[white_out])), 3)
                run["contrasts_figures"][name] = figs
            run["correlation_T1_T2_output"] = round(ncc(outputs[0].array, outputs[2].array,
                                                        output_brain & (np.asarray(outputs[2].array) > 0) & ~lesion), 3)
            results["cases"][case] = run
            print(case, json.dumps(run)[:800], flush=True)
            columns = []
            for name, output in zip(names, outputs):
                columns += [(f"{name} input", contrasts[name].array), (f"{name} output", output.array)]
            figure(args.out / f"{case}.png", columns, lesion, layout,
                   "BraTS-like case from brain2 (T1c real; T1, T2, FLAIR synthesised from its tissues): one anatomy")
    results["slice_thickness_mm"] = args.slice_thickness
    (args.out / args.results_name).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
