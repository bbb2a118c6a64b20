"""MRML nodes <-> Volume through real MRML classes (slicer-core): exact both ways."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io.volume import Volume
from AnonMRIModuleLib import mrml
from slicer_helpers import require_slicer_core, rotated_affine, synthetic_head

slicer = require_slicer_core()  # skips this module without slicer-core


def _node_with(scene, volume, class_name="vtkMRMLScalarVolumeNode", name="input"):
    node = scene.AddNewNodeByClass(class_name, name)
    mrml.update_node_from_volume(node, volume)
    return node


def test_volume_to_node_to_volume_is_exact_with_rotation_and_anisotropic_spacing(scene):
    rng = np.random.default_rng(1)
    array = rng.integers(-1000, 3000, size=(7, 5, 3)).astype(np.int16)  # distinct sizes catch axis swaps
    volume = Volume(array, rotated_affine())
    node = _node_with(scene, volume)
    back = mrml.volume_from_node(node)
    assert back.shape == (7, 5, 3)
    assert back.dtype == np.int16
    np.testing.assert_array_equal(back.array, array)
    np.testing.assert_allclose(back.affine, volume.affine, rtol=0, atol=1e-12)
    np.testing.assert_allclose(back.spacing, [1.2, 0.9, 2.5], atol=1e-12)


def test_node_geometry_matches_slicer_conventions(scene):
    """IJKToRAS is the affine and the VTK memory order is i fastest (Slicer arrays are [k, j, i])."""
    volume = Volume(np.arange(7 * 5 * 3, dtype=np.float32).reshape(7, 5, 3), rotated_affine())
    node = _node_with(scene, volume)
    import vtk
    from vtk.util import numpy_support

    matrix = vtk.vtkMatrix4x4()
    node.GetIJKToRASMatrix(matrix)
    np.testing.assert_allclose(mrml.matrix_to_array(matrix), volume.affine, atol=1e-12)
    np.testing.assert_allclose(node.GetSpacing(), [1.2, 0.9, 2.5], atol=1e-12)
    np.testing.assert_allclose(node.GetOrigin(), volume.origin, atol=1e-12)
    directions = vtk.vtkMatrix4x4()
    node.GetIJKToRASDirectionMatrix(directions)
    np.testing.assert_allclose(mrml.matrix_to_array(directions)[:3, :3], volume.direction, atol=1e-12)
    image = node.GetImageData()
    assert image.GetDimensions() == (7, 5, 3)
    slicer_array = numpy_support.vtk_to_numpy(image.GetPointData().GetScalars()).reshape(3, 5, 7)
    assert slicer_array[2, 4, 6] == volume.array[6, 4, 2]
    assert slicer_array[0, 1, 3] == volume.array[3, 1, 0]


def test_node_to_volume_to_node_is_exact(scene):
    """A node made the Slicer way (spacing, origin, direction set on the node) survives a round trip."""
    import vtk
    from vtk.util import numpy_support

    node = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "made in slicer")
    image = vtk.vtkImageData()
    image.SetDimensions(6, 4, 5)
    image.AllocateScalars(vtk.VTK_FLOAT, 1)
    values = numpy_support.vtk_to_numpy(image.GetPointData().GetScalars())
    values[:] = np.linspace(-1.5, 7.25, values.size)
    node.SetAndObserveImageData(image)
    node.SetSpacing(0.7, 1.3, 3.0)
    node.SetOrigin(10.0, -20.0, 5.5)
    direction = rotated_affine(spacing=(1, 1, 1))[:3, :3]
    node.SetIJKToRASDirections(*[float(v) for v in direction.ravel()])
    volume = mrml.volume_from_node(node)

    copy = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "copy")
    mrml.update_node_from_volume(copy, volume)
    a, b = vtk.vtkMatrix4x4(), vtk.vtkMatrix4x4()
    node.GetIJKToRASMatrix(a)
    copy.GetIJKToRASMatrix(b)
    np.testing.assert_allclose(mrml.matrix_to_array(b), mrml.matrix_to_array(a), atol=1e-12)
    original = numpy_support.vtk_to_numpy(node.GetImageData().GetPointData().GetScalars())
    copied = numpy_support.vtk_to_numpy(copy.GetImageData().GetPointData().GetScalars())
    assert copied.dtype == original.dtype == np.float32
    np.testing.assert_array_equal(copied, original)
    assert copy.GetImageData().GetDimensions() == (6, 4, 5)


def test_linear_parent_transform_is_part_of_the_world_affine_and_removed_on_write(scene):
    volume = Volume(np.arange(24, dtype=np.int16).reshape(4, 3, 2), rotated_affine())
    node = _node_with(scene, volume)
    transform = scene.AddNewNodeByClass("vtkMRMLLinearTransformNode", "shift")
    to_parent = np.eye(4)
    to_parent[:3, 3] = [5.0, -7.0, 11.0]
    transform.SetMatrixTransformToParent(mrml.array_to_matrix(to_parent))
    node.SetAndObserveTransformNodeID(transform.GetID())
    world = mrml.volume_from_node(node)
    np.testing.assert_allclose(world.affine, to_parent @ volume.affine, atol=1e-12)
    local = mrml.volume_from_node(node, world=False)
    np.testing.assert_allclose(local.affine, volume.affine, atol=1e-12)
    out = mrml.add_volume_node(scene, world.with_array(world.array * 2), "out", parent_transform_node=transform)
    np.testing.assert_allclose(mrml.volume_from_node(out, world=False).affine, volume.affine, atol=1e-12)
    np.testing.assert_array_equal(mrml.volume_from_node(out).array, volume.array * 2)


def test_image_extent_not_starting_at_zero_shifts_the_origin(scene):
    import vtk
    from vtk.util import numpy_support

    node = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "cropped")
    image = vtk.vtkImageData()
    image.SetExtent(2, 5, 1, 3, 4, 4)
    image.AllocateScalars(vtk.VTK_SHORT, 1)
    numpy_support.vtk_to_numpy(image.GetPointData().GetScalars())[:] = np.arange(12)
    node.SetAndObserveImageData(image)
    node.SetSpacing(2.0, 3.0, 4.0)
    volume = mrml.volume_from_node(node)
    assert volume.shape == (4, 3, 1)
    np.testing.assert_allclose(volume.origin, [2 * 2.0, 1 * 3.0, 4 * 4.0])


def test_multicomponent_and_empty_nodes_are_refused(scene):
    import vtk

    node = scene.AddNewNodeByClass("vtkMRMLVectorVolumeNode", "rgb")
    image = vtk.vtkImageData()
    image.SetDimensions(3, 3, 3)
    image.AllocateScalars(vtk.VTK_UNSIGNED_CHAR, 3)
    node.SetAndObserveImageData(image)
    with pytest.raises(InputError, match="components"):
        mrml.volume_from_node(node)
    empty = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "empty")
    with pytest.raises(InputError, match="no image data"):
        mrml.volume_from_node(empty)


def test_labelmap_node_as_mask_on_the_same_and_on_another_grid(scene):
    head, brain = synthetic_head(affine=rotated_affine(spacing=(2.0, 2.0, 2.0)))
    image_node = _node_with(scene, head)
    labelmap = _node_with(scene, brain.with_array(brain.array * 3), "vtkMRMLLabelMapVolumeNode", "brain")
    mask = mrml.mask_from_node(labelmap, image_node, what="brain mask")
    assert mask.dtype == np.uint8 and set(np.unique(mask.array)) == {0, 1}
    np.testing.assert_array_equal(mask.array, brain.array)
    np.testing.assert_allclose(mask.affine, head.affine, atol=1e-12)

    # the same brain on a grid of half the resolution (2x spacing, same world extent) is resampled
    coarse_affine = head.affine.copy()
    coarse_affine[:3, :3] *= 2.0
    coarse = Volume(np.ascontiguousarray(brain.array[::2, ::2, ::2]), coarse_affine)
    coarse_node = _node_with(scene, coarse, "vtkMRMLLabelMapVolumeNode", "coarse brain")
    resampled = mrml.mask_from_node(coarse_node, image_node, what="brain mask")
    assert resampled.shape == head.shape
    np.testing.assert_array_equal(resampled.array[::2, ::2, ::2], coarse.array)
    agreement = (resampled.array == brain.array).mean()
    assert agreement > 0.97


def test_empty_mask_is_refused(scene):
    head, brain = synthetic_head()
    image_node = _node_with(scene, head)
    labelmap = _node_with(scene, brain.with_array(np.zeros_like(brain.array)), "vtkMRMLLabelMapVolumeNode")
    with pytest.raises(InputError, match="empty"):
        mrml.mask_from_node(labelmap, image_node, what="brain mask")


def _segmentation_from_mask(scene, mask: Volume, reference_node, names=("lesion",)):
    """A segmentation node whose segments are made from ``mask`` labels 1, 2, ... (Slicer's import)."""
    labelmap = _node_with(scene, mask, "vtkMRMLLabelMapVolumeNode", "labels")
    segmentation = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "segmentation")
    segmentation.SetReferenceImageGeometryParameterFromVolumeNode(reference_node)
    mrml.ensure_binary_labelmap_support()
    assert slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(labelmap, segmentation)
    segmentation_ids = [segmentation.GetSegmentation().GetNthSegmentID(n)
                        for n in range(segmentation.GetSegmentation().GetNumberOfSegments())]
    for sid, name in zip(segmentation_ids, names):
        segmentation.GetSegmentation().GetSegment(sid).SetName(name)
    scene.RemoveNode(labelmap)
    return segmentation


def test_segmentation_node_as_mask_is_a_binary_labelmap_on_the_reference_grid(scene):
    head, brain = synthetic_head(affine=rotated_affine(spacing=(2.0, 1.5, 2.5)))
    image_node = _node_with(scene, head)
    labels = np.zeros(head.shape, np.uint8)
    labels[10:14, 12:20, 8:11] = 1          # "lesion"
    labels[25:28, 5:9, 20:26] = 2           # "edema"
    segmentation = _segmentation_from_mask(scene, head.with_array(labels), image_node, names=("lesion", "edema"))

    lesion = mrml.mask_from_node(segmentation, image_node, names=["lesion"], what="lesion segmentation")
    np.testing.assert_array_equal(lesion.array, (labels == 1).astype(np.uint8))
    np.testing.assert_allclose(lesion.affine, head.affine, atol=1e-12)
    both = mrml.mask_from_node(segmentation, image_node, what="lesion segmentation")
    np.testing.assert_array_equal(both.array, (labels > 0).astype(np.uint8))
    assert scene.GetNodesByClass("vtkMRMLLabelMapVolumeNode").GetNumberOfItems() == 0  # temporary removed
    with pytest.raises(InputError, match="no segment named"):
        mrml.mask_from_node(segmentation, image_node, names=["tumour"])


def test_scores_table_round_trip(scene):
    scores = {"ssim_outside_brain": 0.42, "brain_voxels_changed": 0, "reid": {"rank1": 0.1, "model": "siamese"}}
    table = mrml.scores_table_node(scene, scores)
    assert table.GetNumberOfRows() == 4
    assert mrml.scores_from_table_node(table) == {"ssim_outside_brain": 0.42, "brain_voxels_changed": 0.0,
                                                   "reid.rank1": 0.1, "reid.model": "siamese"}
    mrml.scores_table_node(scene, {"a": 1.0}, table_node=table)
    assert table.GetNumberOfRows() == 1
