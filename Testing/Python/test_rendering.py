"""Ray-cast face renderings: geometry, orientation invariance, shading range, figures, CLI."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume
from AnonMRILib.rendering import (VIEW_NAMES, RenderSettings, check_png_path, make_camera, ray_cast,
                                  render_face, save_png, side_by_side, skin_iso_level)
from AnonMRILib.rendering.raycast import SurfaceRenderer

SIZE = 96


@pytest.fixture(scope="module")
def sample_head() -> Volume:
    from AnonMRILib.sample_data import load_sample_head

    return load_sample_head()


def flipped_copy(volume: Volume, axis: int) -> Volume:
    """The same image stored with voxel axis ``axis`` reversed (e.g. RAS -> LAS); same world content."""
    flip = np.eye(4)
    flip[axis, axis] = -1.0
    flip[axis, 3] = volume.shape[axis] - 1
    return Volume(np.flip(volume.array, axis=axis).copy(), volume.affine @ flip)


def permuted_copy(volume: Volume, order) -> Volume:
    """The same image with its voxel axes permuted (e.g. RAS -> SRA storage); same world content."""
    permutation = np.eye(4)[:, list(order) + [3]]
    return Volume(np.transpose(volume.array, order).copy(), volume.affine @ permutation)


def test_anterior_view_shows_the_face_with_the_nose_nearest(sample_head):
    result = ray_cast(sample_head, make_camera("anterior"), size=SIZE)
    assert result.image.shape == (SIZE, SIZE) and result.image.dtype == np.float32
    assert 0.0 <= result.image.min() and result.image.max() <= 1.0
    assert 0.3 < result.hit.mean() < 0.8                      # a head, not an empty or full frame
    assert np.all(result.image[~result.hit] == 0.0)
    assert np.all(result.image[result.hit] > 0.0)
    depth = np.where(result.hit, result.depth_mm, np.inf)
    row, column = np.unravel_index(np.argmin(depth), depth.shape)
    # the nose tip: horizontally central, vertically in the lower middle of the frame
    assert 0.35 * SIZE < column < 0.65 * SIZE
    assert 0.45 * SIZE < row < 0.75 * SIZE
    # it protrudes: the nose is well in front of the cheeks' level at the same height
    assert np.nanmedian(result.depth_mm[row]) - depth[row, column] > 10.0


def test_views_differ_and_opposite_views_mirror_the_silhouette(sample_head):
    anterior = ray_cast(sample_head, make_camera("anterior"), size=SIZE)
    posterior = ray_cast(sample_head, make_camera("posterior"), size=SIZE)
    assert np.abs(anterior.image - posterior.image).mean() > 0.05
    # the outline seen from behind is the one seen from the front, mirrored left-right
    agreement = (anterior.hit == posterior.hit[:, ::-1]).mean()
    assert agreement > 0.97
    for view in VIEW_NAMES:
        image = render_face(sample_head, view, size=48)
        assert image.shape == (48, 48) and (image > 0).mean() > 0.2, view


@pytest.mark.parametrize("copy", [lambda v: flipped_copy(v, 0), lambda v: flipped_copy(v, 1),
                                  lambda v: permuted_copy(v, (2, 0, 1))],
                         ids=["LAS", "RPS", "SRA"])
def test_voxel_order_does_not_change_the_rendering(sample_head, copy):
    reference = ray_cast(sample_head, make_camera("anterior", 20.0, 10.0), size=SIZE)
    other = ray_cast(copy(sample_head), make_camera("anterior", 20.0, 10.0), size=SIZE)
    assert (reference.hit == other.hit).mean() > 0.998
    both = reference.hit & other.hit
    assert np.abs(reference.depth_mm[both] - other.depth_mm[both]).max() < 0.05
    assert np.abs(reference.image[both] - other.image[both]).max() < 0.02


def test_azimuth_turns_the_viewer_like_turning_the_head(sample_head):
    """Turning the head by +90 deg about S (face to the left) seen from the left = the anterior view."""
    angle = np.deg2rad(90.0)
    turn = np.eye(4)
    turn[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    turned = Volume(sample_head.array, turn @ sample_head.affine)
    front = ray_cast(sample_head, make_camera("anterior"), size=SIZE)
    from_left = ray_cast(turned, make_camera("left"), size=SIZE)
    assert (front.hit == from_left.hit).mean() > 0.998
    np.testing.assert_allclose(from_left.image, front.image, atol=0.02)
    same_as_left = render_face(sample_head, "anterior", size=SIZE, azimuth_deg=90.0)
    np.testing.assert_allclose(same_as_left, render_face(sample_head, "left", size=SIZE), atol=1e-5)


def test_automatic_iso_level_follows_the_intensity_scale(sample_head):
    scaled = sample_head.with_array(sample_head.array.astype(np.float32) * 7.5 + 300.0)
    assert skin_iso_level(scaled) == pytest.approx(skin_iso_level(sample_head) * 7.5 + 300.0, rel=1e-3)
    np.testing.assert_allclose(render_face(scaled, size=SIZE), render_face(sample_head, size=SIZE), atol=2e-3)


def test_empty_space_skipping_finds_the_same_surface(sample_head):
    plain = ray_cast(sample_head, make_camera("right", 15.0, -20.0), size=64,
                     settings=RenderSettings(block_voxels=1))
    skipping = ray_cast(sample_head, make_camera("right", 15.0, -20.0), size=64,
                        settings=RenderSettings(block_voxels=8))
    assert np.array_equal(plain.hit, skipping.hit)
    np.testing.assert_allclose(plain.depth_mm[plain.hit], skipping.depth_mm[plain.hit], atol=1e-3)


def test_renderer_reuse_and_sphere_geometry():
    """A synthetic ball of radius 30 mm: its rendered depth is the sphere's, every view alike."""
    shape, spacing = (64, 70, 60), np.array([1.1, 1.0, 1.2])
    centre = (np.array(shape) - 1) / 2.0
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    radius_mm = np.linalg.norm((grid - centre) * spacing, axis=-1)
    ball = Volume(np.clip((30.0 - radius_mm) * 100.0 + 50.0, 0, 400).astype(np.float32),
                  np.diag(list(spacing) + [1.0]))
    renderer = SurfaceRenderer(ball, iso_level=50.0)
    for view in ("anterior", "superior", "left"):
        result = renderer.render(make_camera(view), size=64)
        # silhouette area = pi r^2 (within a pixel ring)
        area = result.hit.sum() * result.pixel_mm ** 2
        assert area == pytest.approx(np.pi * 30.0 ** 2, rel=0.05), view
        # the nearest point is the sphere's pole: depth of the centre minus the radius
        row, column = np.unravel_index(np.nanargmin(result.depth_mm), result.depth_mm.shape)
        assert abs(row - 31.5) <= 2 and abs(column - 31.5) <= 2
        # centre pixel facing the viewer is lit the most brightly (light almost from the viewer)
        assert result.image[result.hit].max() > 0.8


def test_bad_arguments_raise_input_errors(sample_head):
    with pytest.raises(InputError):
        render_face(sample_head, "frontal")
    with pytest.raises(InputError):
        render_face(sample_head, size=4)
    with pytest.raises(InputError):
        render_face(sample_head, iso_level=float("nan"))
    with pytest.raises(InputError):
        make_camera("anterior", azimuth_deg=float("inf"))


def test_side_by_side_and_save_png(tmp_path):
    from PIL import Image

    left = np.zeros((40, 30), np.float32)
    right = np.ones((20, 20), np.float32)
    figure = side_by_side([left, right], ["before", "after"])
    assert figure.dtype == np.float32 and figure.shape[0] == 40 + 14
    assert figure.max() == pytest.approx(1.0) and figure.min() == 0.0
    grid = side_by_side([left, left, left, left], columns=2)
    assert grid.shape == (2 * 40 + 2, 2 * 30 + 2)
    path = save_png(figure, tmp_path / "pair.png")
    with Image.open(path) as image:
        assert image.size == (figure.shape[1], figure.shape[0]) and image.mode == "L"
    assert [p.name for p in tmp_path.iterdir()] == ["pair.png"]     # nothing temporary left behind
    with pytest.raises(InputError):
        save_png(figure, tmp_path / "pair.jpg")
    assert save_png(figure, tmp_path / "new" / "folder" / "pair.png").is_file()   # missing folders are created
    with pytest.raises(InputError):
        side_by_side([left], ["a", "b"])
    with pytest.raises(InputError):
        check_png_path(tmp_path)


def test_cli_render_writes_png_and_refuses_bad_input(tmp_path, capsys):
    from PIL import Image

    from AnonMRILib.cli.main import main
    from AnonMRILib.sample_data import sample_head_path

    out = tmp_path / "face.png"
    assert main(["render", str(sample_head_path()), str(out), "--size", "64", "--azimuth", "30"]) == 0
    with Image.open(out) as image:
        assert image.size == (64, 64) and np.asarray(image).max() > 100
    strip = tmp_path / "views.png"
    assert main(["render", str(sample_head_path()), str(strip), "--view", "all", "--size", "32"]) == 0
    with Image.open(strip) as image:
        assert image.size[0] > 6 * 32
    assert main(["render", str(sample_head_path()), str(tmp_path / "face.jpg")]) == 2
    assert main(["render", str(tmp_path / "missing.nii.gz"), str(tmp_path / "x.png")]) == 2
    assert "error" in capsys.readouterr().err
    assert main(["--quiet", "render", str(sample_head_path()), str(tmp_path / "new" / "x.png"), "--size", "32"]) == 0
    assert (tmp_path / "new" / "x.png").is_file() and capsys.readouterr().out == ""  # folder made, nothing printed
    with pytest.raises(SystemExit) as exit_info:
        main(["render", str(sample_head_path()), str(out), "--view", "frontal"])
    assert exit_info.value.code == 2
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "face.jpg").exists()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_rendering_matches_cpu(sample_head):
    cpu = ray_cast(sample_head, make_camera("anterior"), size=SIZE, device="cpu")
    gpu = ray_cast(sample_head, make_camera("anterior"), size=SIZE, device="cuda")
    assert (cpu.hit == gpu.hit).mean() > 0.999
    both = cpu.hit & gpu.hit
    assert np.abs(cpu.image[both] - gpu.image[both]).max() < 0.02
