"""Behind the face the placed template takes the patient's outline; the face keeps the stiff field's
template proportions (AnonMRILib.transforms.anatomical_prior: outline_weight, _fit_outline)."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io.volume import Volume
from AnonMRILib.transforms.anatomical_prior import (AnatomicalPriorConfig, load_template_head, outline_weight,
                                                    place_template_labels)


def test_the_outline_weight_spares_the_face_and_the_brain_edge():
    config = AnatomicalPriorConfig()  # face ramp 30 -> 5 mm anterior of the centroid, reach 5 -> 15 mm
    affine = np.eye(4)
    affine[1, 3] = -100.0  # anterior coordinate of index j: j - 100 mm
    far_outside = np.full((1, 201, 1), -40.0)  # signed distance to the brain (mm, positive inside)
    weight = outline_weight(far_outside, affine, (0.0, 0.0, 0.0), config)[0, :, 0]
    anterior = np.arange(201) - 100.0
    assert np.all(weight[anterior >= 30.0] == 0.0) and np.all(weight[anterior <= 5.0] == 1.0)
    assert weight[anterior == 17.5] == pytest.approx(0.5)
    assert np.all(np.diff(weight) <= 0.0)  # no step: it only falls towards the face
    depth = np.linspace(-30.0, 5.0, 36)[None, None, :]  # behind the face, at these distances to the brain
    near = outline_weight(np.broadcast_to(depth, (1, 201, 36)), affine, (0.0, 0.0, 0.0), config)[0, 0]
    assert np.all(near[depth[0, 0] >= -5.0] == 0.0) and np.all(near[depth[0, 0] <= -15.0] == 1.0)
    with pytest.raises(InputError, match="outline"):
        AnatomicalPriorConfig(outline_face_mm=(5.0, 30.0))
    with pytest.raises(InputError, match="outline"):
        AnatomicalPriorConfig(outline_iterations=-1)


def test_a_head_larger_at_the_back_gets_its_back_and_keeps_the_templates_face():
    """The template's own masks with the hull grown 8 mm at the back (behind 20 mm posterior of the
    brain's centroid): with the outline fit the placed template's occiput follows the hull back; the
    stiff field alone leaves it 3 mm inside. The face is placed as before (Dice 1.0 measured)."""
    template = load_template_head()
    brain = np.asarray(template.brain_mask.array) != 0
    hull = np.asarray(template.convex_hull.array) != 0
    affine = template.labels.affine
    assert np.allclose(affine[:3, :3], np.eye(3))  # RAS, 1 mm: axis 1 is anterior
    centre = int(round(np.argwhere(brain)[:, 1].mean()))
    grown = hull.copy()
    behind = np.zeros_like(hull)
    behind[:, :-8, :] = hull[:, 8:, :]  # the hull moved 8 mm back
    behind[:, centre - 20:, :] = False
    grown |= behind
    heads = {}
    for iterations in (0, 20):
        config = AnatomicalPriorConfig(edge_iterations=0, outline_iterations=iterations)
        heads[iterations] = np.asarray(place_template_labels(Volume(brain.astype(np.uint8), affine),
                                                             Volume(grown.astype(np.uint8), affine),
                                                             config).array) != 0
    own = np.asarray(template.labels.array) != 0

    def back(head):
        """Mean most-posterior head voxel (j) over the columns through the brain's upper half."""
        top = np.argwhere(brain)[:, 2]
        rows = [np.argmax(head[i, :, k]) for i in range(head.shape[0])
                for k in range((top.min() + top.max()) // 2, top.max()) if head[i, :, k].any() and brain[i, :, k].any()]
        return float(np.mean(rows))

    moved_without, moved_with = back(own) - back(heads[0]), back(own) - back(heads[20])
    # of the 8 mm the hull grew: 7.7 mm with the fit, 4.9 mm with the stiff field alone
    assert moved_with > 7.0, (moved_without, moved_with)
    assert moved_with > moved_without + 2.0, (moved_without, moved_with)
    face = np.zeros_like(brain)
    face[:, centre + 60:, :] = True
    a, b = heads[0] & face, heads[20] & face
    assert 2.0 * (a & b).sum() / (a.sum() + b.sum()) > 0.98
