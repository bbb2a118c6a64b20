"""The anatomical prior's placement reads a head cut by the field of view as cut, not as ending there
(AnonMRILib.transforms.anatomical_prior: touched_faces, extended_beyond_cuts, inside_cuts, _placement)."""
import numpy as np

from AnonMRILib.io.volume import Volume
from AnonMRILib.transforms.anatomical_prior import (AnatomicalPriorConfig, _placement, extended_beyond_cuts,
                                                    inside_cuts, load_template_head, touched_faces)
from AnonMRILib.transforms.distance import signed_distance


def test_a_mask_cut_by_the_grid_is_continued_past_the_cut():
    grid = np.indices((40, 40, 40)).astype(np.float64)
    ball = ((grid - 20.0) ** 2).sum(axis=0) <= 15.0 ** 2
    cut = ball[:, :, 12:]  # a ball whose lowest 7 mm of 35 lie below the field of view
    assert touched_faces(cut) == [(2, 0)]
    affine = np.diag([1.0, 1.0, 1.0, 1.0])
    affine[2, 3] = 12.0
    (extended,), extended_affine = extended_beyond_cuts([cut], affine, touched_faces(cut), 10.0)
    assert extended.shape == (40, 40, 38) and extended_affine[2, 3] == 2.0
    # on a grid reaching 5 mm past every face: outside the cut, inside elsewhere (air was seen there)
    grid = np.diag([1.0, 1.0, 1.0, 1.0])
    grid[:3, 3] = [-5.0, -5.0, 7.0]
    inside = inside_cuts(touched_faces(cut), cut.shape, affine, (50, 50, 38), grid)
    assert not inside[:, :, :5].any() and inside[:, :, 5:].all()
    # inside the field of view, near the cut, the distance is the ball's, not the distance to the cut
    # (which it is when the cut ball is set on a larger grid, as the registration grid does)
    near = ball[:, :, 12:15]
    own = signed_distance(extended)[:, :, 10:13][near]
    truth = signed_distance(ball)[:, :, 12:15][near]
    on_larger_grid = ball.copy()
    on_larger_grid[:, :, :12] = False
    naive = signed_distance(on_larger_grid)[:, :, 12:15][near]
    assert np.abs(naive - truth).mean() > 1.5  # mm: the cut read as the head's surface
    # the ball narrows below the cut, the continuation does not: close, not equal
    assert np.abs(own - truth).mean() < 0.4 * np.abs(naive - truth).mean()
    assert np.array_equal(extended[:, :, 10:], cut)  # inside it, nothing changed
    assert touched_faces(ball) == []


def test_the_template_placed_on_its_own_head_cut_above_the_neck_stays_in_place():
    """A scan whose field of view stops 50 mm above the template's lowest slice: placed on the
    template's own brain mask and hull cut there, the template must land (nearly) on itself. Read as
    where the head ends, the cut moved it by 2.0 mm on average over the brain."""
    import SimpleITK as sitk

    template = load_template_head()
    low = template.neck_cut[1] + 50
    cut = tuple(slice(None) for _ in range(2)) + (slice(low, None),)
    affine = template.labels.affine.copy()
    affine[:3, 3] = affine[:3, 3] + affine[:3, 2] * low
    brain = Volume(np.asarray(template.brain_mask.array)[cut], affine)
    hull = Volume(np.asarray(template.convex_hull.array)[cut], affine)
    chain = _placement(brain, hull, template, AnatomicalPriorConfig(edge_iterations=0))[0]
    points = brain.world_coordinates(np.argwhere(np.asarray(brain.array) != 0)[::400].astype(np.float64))
    moved = np.array([chain.TransformPoint(tuple(map(float, p))) for p in points])
    shift = np.linalg.norm(moved - points, axis=1)
    assert isinstance(chain, sitk.CompositeTransform)
    assert shift.mean() < 1.0, shift.mean()
