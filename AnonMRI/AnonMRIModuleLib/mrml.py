"""MRML nodes <-> :class:`AnonMRILib.io.Volume`, and per-scan score tables.

Conventions (both sides are RAS, millimetres):

- a Volume's ``array[i, j, k]`` with ``affine`` mapping voxel (i, j, k) to RAS mm;
- an MRML volume node's ``vtkImageData`` stores voxels with i fastest, so the array Slicer shows
  (``slicer.util.arrayFromVolume``) is indexed ``[k, j, i]``; its ``IJKToRAS`` matrix maps voxel
  indices to the node's *local* RAS frame, and a linear parent transform maps that frame to world RAS.

Volumes made here are in **world** RAS (``IJKToRAS`` composed with a linear parent transform, and
shifted when the image extent does not start at 0), so masks and images under different transforms
still meet in the same frame. Writing a Volume back into a node under a parent transform removes
that transform again, so ``node -> Volume -> node`` is exact both ways.

Only ``vtk`` and the MRML classes are used (no Qt, no ``slicer.util``), so this runs in Slicer and
with Kitware's ``slicer-core`` wheel alike.
"""
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from AnonMRILib.errors import InputError
from AnonMRILib.io.volume import Volume

#: classes accepted as a mask input (brain mask, lesion mask)
MASK_NODE_CLASSES = ("vtkMRMLLabelMapVolumeNode", "vtkMRMLSegmentationNode", "vtkMRMLScalarVolumeNode")


# --- vtkMatrix4x4 <-> numpy ---------------------------------------------------------------------
def matrix_to_array(matrix) -> np.ndarray:
    """A (4, 4) float64 array from a ``vtkMatrix4x4``."""
    return np.array([[matrix.GetElement(r, c) for c in range(4)] for r in range(4)], dtype=np.float64)


def array_to_matrix(array: np.ndarray):
    """A ``vtkMatrix4x4`` from a (4, 4) array."""
    import vtk

    array = np.asarray(array, dtype=np.float64)
    matrix = vtk.vtkMatrix4x4()
    for r in range(4):
        for c in range(4):
            matrix.SetElement(r, c, float(array[r, c]))
    return matrix


def parent_to_world(node) -> np.ndarray:
    """The 4x4 matrix from ``node``'s local RAS frame to world RAS (identity without a transform).

    Raises :class:`InputError` for a non-linear parent transform: harden or remove it first.
    """
    import vtk

    transform_node = node.GetParentTransformNode()
    if transform_node is None:
        return np.eye(4)
    if not transform_node.IsTransformToWorldLinear():
        raise InputError(f"'{node.GetName()}' is under a non-linear transform; harden it first "
                         "(Data module: right-click the transform, Harden transform)")
    matrix = vtk.vtkMatrix4x4()
    transform_node.GetMatrixTransformToWorld(matrix)
    return matrix_to_array(matrix)


# --- volume nodes -------------------------------------------------------------------------------
def node_affine(node, world: bool = True) -> np.ndarray:
    """Voxel (of the stored array, index 0 at the image extent's start) -> RAS mm matrix of ``node``."""
    import vtk

    ijk_to_ras = vtk.vtkMatrix4x4()
    node.GetIJKToRASMatrix(ijk_to_ras)
    affine = matrix_to_array(ijk_to_ras)
    image = node.GetImageData()
    if image is not None:
        extent = image.GetExtent()
        start = np.array([extent[0], extent[2], extent[4]], dtype=np.float64)
        if np.any(start != 0):
            affine[:3, 3] = affine[:3, 3] + affine[:3, :3] @ start
    if world:
        affine = parent_to_world(node) @ affine
    return affine


def array_from_node(node) -> np.ndarray:
    """A copy of ``node``'s voxels as an ``[i, j, k]`` array (single-component images only)."""
    from vtk.util import numpy_support

    image = node.GetImageData() if node is not None else None
    if image is None or image.GetPointData() is None or image.GetPointData().GetScalars() is None:
        name = node.GetName() if node is not None else "volume"
        raise InputError(f"'{name}' has no image data")
    if image.GetNumberOfScalarComponents() != 1:
        raise InputError(f"'{node.GetName()}' has {image.GetNumberOfScalarComponents()} components per voxel; "
                         "a single-component (scalar) volume is needed")
    nx, ny, nz = image.GetDimensions()
    flat = numpy_support.vtk_to_numpy(image.GetPointData().GetScalars())
    return np.ascontiguousarray(flat.reshape(nz, ny, nx).transpose(2, 1, 0))


def volume_from_node(node, world: bool = True) -> Volume:
    """A :class:`Volume` (copied voxels, affine to world RAS when ``world``) from a volume node."""
    if node is None or not node.IsA("vtkMRMLVolumeNode"):
        raise InputError("a volume node is needed")
    return Volume(array_from_node(node), node_affine(node, world=world))


def _vtk_scalars_from_array(array_kji: np.ndarray):
    from vtk.util import numpy_support

    data = np.asarray(array_kji)
    if data.dtype == np.bool_:
        data = data.astype(np.uint8)
    elif data.dtype == np.float16:
        data = data.astype(np.float32)
    flat = np.ascontiguousarray(data).ravel()
    scalars = numpy_support.numpy_to_vtk(flat, deep=True)
    scalars.SetName("ImageScalars")
    return scalars


def update_node_from_volume(node, volume: Volume, world: bool = True) -> None:
    """Set ``node``'s voxels and geometry from ``volume``.

    With ``world`` the Volume's affine is taken as world RAS and the node's linear parent transform
    (if any) is removed from it, so the node shows the voxels where the Volume says they are.
    """
    import vtk

    affine = np.asarray(volume.affine, dtype=np.float64)
    if world:
        affine = np.linalg.inv(parent_to_world(node)) @ affine
    array_kji = np.asarray(volume.array).transpose(2, 1, 0)
    image = vtk.vtkImageData()
    nx, ny, nz = volume.shape
    image.SetDimensions(int(nx), int(ny), int(nz))
    image.GetPointData().SetScalars(_vtk_scalars_from_array(array_kji))
    was_modifying = node.StartModify()
    try:
        node.SetIJKToRASMatrix(array_to_matrix(affine))
        node.SetAndObserveImageData(image)
    finally:
        node.EndModify(was_modifying)


def add_volume_node(scene, volume: Volume, name: str, labelmap: bool = False,
                    parent_transform_node=None, show: bool = True):
    """A new scalar (or labelmap) volume node in ``scene`` holding ``volume`` (world RAS affine)."""
    class_name = "vtkMRMLLabelMapVolumeNode" if labelmap else "vtkMRMLScalarVolumeNode"
    node = scene.AddNewNodeByClass(class_name, scene.GenerateUniqueName(name))
    if parent_transform_node is not None:
        node.SetAndObserveTransformNodeID(parent_transform_node.GetID())
    update_node_from_volume(node, volume, world=True)
    if show:
        node.CreateDefaultDisplayNodes()
        display = node.GetDisplayNode()
        if display is not None and not labelmap and hasattr(display, "AutoWindowLevelOn"):
            display.AutoWindowLevelOn()
    return node


def add_segmentation_node(scene, mask: Volume, name: str, segment_name: str = "mask",
                          color=(0.9, 0.7, 0.2), parent_transform_node=None):
    """A new segmentation node in ``scene`` with one segment: the nonzero voxels of ``mask``.

    The segment is editable in Segment Editor; its binary labelmap keeps ``mask``'s grid (world
    RAS affine) exactly, so :func:`mask_from_node` gives the same voxels back.
    """
    import slicer

    ensure_binary_labelmap_support()
    labelmap = add_volume_node(scene, mask.with_array((np.asarray(mask.array) != 0).astype(np.uint8)),
                               "AnonMRI temporary mask", labelmap=True, parent_transform_node=parent_transform_node,
                               show=False)
    segmentation = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", scene.GenerateUniqueName(name))
    try:
        if parent_transform_node is not None:
            segmentation.SetAndObserveTransformNodeID(parent_transform_node.GetID())
        segmentation.SetReferenceImageGeometryParameterFromVolumeNode(labelmap)
        if not slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(labelmap, segmentation):
            raise InputError(f"the mask could not be turned into the segmentation '{name}'")
    finally:
        scene.RemoveNode(labelmap)
    segmentation.CreateDefaultDisplayNodes()
    segments = segmentation.GetSegmentation()
    if segments.GetNumberOfSegments() > 0:
        segment = segments.GetSegment(segments.GetNthSegmentID(0))
        segment.SetName(segment_name)
        segment.SetColor(*color)
    return segmentation


# --- masks --------------------------------------------------------------------------------------
def _resample_nearest(mask: Volume, image: Volume) -> np.ndarray:
    """``mask`` resampled (nearest neighbour) onto ``image``'s grid; outside the mask is 0."""
    from scipy import ndimage

    voxel_to_voxel = np.linalg.inv(mask.affine) @ image.affine
    data = np.asarray(mask.array)
    if data.dtype == np.bool_:
        data = data.astype(np.uint8)
    return ndimage.affine_transform(data, voxel_to_voxel[:3, :3], offset=voxel_to_voxel[:3, 3],
                                    output_shape=image.shape, order=0, mode="constant", cval=0)


def _mask_on_reference(labels: Volume, reference_node) -> Volume:
    """Nonzero voxels of ``labels`` as a 0/1 uint8 Volume on ``reference_node``'s grid (world RAS)."""
    reference_affine = node_affine(reference_node)
    reference_shape = tuple(int(n) for n in reference_node.GetImageData().GetDimensions())
    binary = (np.asarray(labels.array) != 0).astype(np.uint8)
    if labels.shape != reference_shape or not np.allclose(labels.affine, reference_affine, atol=1e-3):
        reference = Volume(np.zeros(reference_shape, np.uint8), reference_affine)
        binary = (_resample_nearest(labels.with_array(binary), reference) != 0).astype(np.uint8)
    return Volume(binary, reference_affine)


def ensure_binary_labelmap_support() -> None:
    """Register the segmentation conversion rules when no application did (``slicer-core``)."""
    import slicer

    factory = slicer.vtkSegmentationConverterFactory.GetInstance()
    rule_names = set()
    rules = factory.GetConverterRules()
    for index in range(len(rules) if rules is not None else 0):
        rule_names.add(rules[index].GetClassName())
    for rule_class in ("vtkBinaryLabelmapToClosedSurfaceConversionRule",
                       "vtkClosedSurfaceToBinaryLabelmapConversionRule"):
        if rule_class not in rule_names and hasattr(slicer, rule_class):
            factory.RegisterConverterRule(getattr(slicer, rule_class)())


def segment_ids(segmentation_node, names: Optional[Sequence[str]] = None) -> List[str]:
    """IDs of the segments named in ``names`` (ID or name), or of every segment when ``names`` is None."""
    segmentation = segmentation_node.GetSegmentation()
    all_ids = [segmentation.GetNthSegmentID(n) for n in range(segmentation.GetNumberOfSegments())]
    if names is None:
        return all_ids
    chosen = []
    for wanted in names:
        match = [sid for sid in all_ids if sid == wanted or segmentation.GetSegment(sid).GetName() == wanted]
        if not match:
            raise InputError(f"'{segmentation_node.GetName()}' has no segment named {wanted!r}")
        chosen.extend(match)
    return chosen


def mask_from_segmentation(segmentation_node, reference_node, names: Optional[Sequence[str]] = None,
                           what: str = "mask") -> Volume:
    """The union of segments as a 0/1 uint8 Volume on ``reference_node``'s grid (world RAS).

    Uses Slicer's own export (``vtkSlicerSegmentationsModuleLogic.ExportSegmentsToLabelmapNode``)
    so the result is what Slicer shows; a temporary labelmap node is removed again.
    """
    import slicer
    import vtk

    ids = segment_ids(segmentation_node, names)
    if not ids:
        raise InputError(f"the {what} segmentation '{segmentation_node.GetName()}' has no segment")
    ensure_binary_labelmap_support()
    segmentation_node.CreateBinaryLabelmapRepresentation()
    id_array = vtk.vtkStringArray()
    for sid in ids:
        id_array.InsertNextValue(sid)
    scene = reference_node.GetScene()
    labelmap = scene.AddNewNodeByClass("vtkMRMLLabelMapVolumeNode", "AnonMRI temporary mask")
    try:
        if reference_node.GetParentTransformNode() is not None:
            labelmap.SetAndObserveTransformNodeID(reference_node.GetParentTransformNode().GetID())
        ok = slicer.vtkSlicerSegmentationsModuleLogic.ExportSegmentsToLabelmapNode(
            segmentation_node, id_array, labelmap, reference_node)
        if not ok or labelmap.GetImageData() is None:
            raise InputError(f"the {what} segmentation '{segmentation_node.GetName()}' could not be "
                             "converted to a labelmap")
        labels = volume_from_node(labelmap)
    finally:
        display = labelmap.GetDisplayNode()
        if display is not None:
            scene.RemoveNode(display)
        scene.RemoveNode(labelmap)
    return _mask_on_reference(labels, reference_node)


def mask_from_node(mask_node, reference_node, names: Optional[Sequence[str]] = None,
                   what: str = "mask", require_nonempty: bool = True) -> Volume:
    """A 0/1 uint8 mask Volume on ``reference_node``'s grid from a labelmap or segmentation node.

    - segmentation node: union of the segments ``names`` (all when None);
    - labelmap (or scalar) volume node: nonzero voxels; resampled (nearest neighbour) onto the
      reference grid when it lies on another grid, using both nodes' world geometry.
    """
    if mask_node is None:
        raise InputError(f"no {what} node was given")
    if mask_node.IsA("vtkMRMLSegmentationNode"):
        mask = mask_from_segmentation(mask_node, reference_node, names, what=what)
    elif mask_node.IsA("vtkMRMLVolumeNode"):
        mask = _mask_on_reference(volume_from_node(mask_node), reference_node)
    else:
        raise InputError(f"'{mask_node.GetName()}' is a {mask_node.GetClassName()}; the {what} must be a "
                         "labelmap volume or a segmentation")
    if require_nonempty and not mask.array.any():
        raise InputError(f"the {what} '{mask_node.GetName()}' is empty on the image's grid")
    return mask


# --- score tables -------------------------------------------------------------------------------
#: name of the first row of a scores table: ``scan_scores``' ``verdict``, word for word
VERDICT_ROW = "Verdict"
#: name of the row after it: ``scan_scores``' ``residual`` (what the outline-reading Siamese attacker
#: finds, which a convex hull keeps by design; it does not decide the verdict), word for word
RESIDUAL_ROW = "Residual"
#: name stem of the rows after those: ``scan_scores``' ``explanations`` (why contradicting evidence was
#: resolved the way the verdict says), "Explanation 1", "Explanation 2", ...
EXPLANATION_ROW = "Explanation"


def _cell(value) -> Union[float, str]:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def flatten_scores(scores: Mapping, prefix: str = "") -> List[Tuple[str, Union[float, str]]]:
    """``{"a": 1, "b": {"c": 2}, "d": ["x", "y"]}`` -> ``[("a", 1.0), ("b.c", 2.0), ("d.1", "x"),
    ("d.2", "y")]``; non-numbers become text, list items are numbered from 1."""
    rows: List[Tuple[str, Union[float, str]]] = []
    for key, value in scores.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(flatten_scores(value, prefix=name + "."))
        elif isinstance(value, (list, tuple)):
            for number, item in enumerate(value, start=1):
                if isinstance(item, Mapping):
                    rows.extend(flatten_scores(item, prefix=f"{name}.{number}."))
                else:
                    rows.append((f"{name}.{number}", _cell(item)))
        else:
            rows.append((name, _cell(value)))
    return rows


def _is_explanation(name: str) -> bool:
    import re

    return bool(re.fullmatch(r"explanations\.\d+|" + EXPLANATION_ROW + r" \d+", name))


def scores_table_rows(scores: Mapping) -> List[Tuple[str, Union[float, str]]]:
    """The rows of a scores table: ``("Verdict", the verdict)`` first, then ``("Residual", the outline
    residual)``, ``("Explanation 1", ...)`` for each explanation, then the evidence (flattened names,
    as :func:`flatten_scores`).

    ``scores`` is :func:`AnonMRILib.evaluation.scores.scan_scores`' dict, nested or flattened (what
    the worker sends back), or what :func:`scores_from_table_node` read from a table. The verdict,
    the residual and the explanations are kept word for word; scores without them have no such row.
    """
    rows = flatten_scores(scores)
    lead = [(label, str(value)) for key, label in (("verdict", VERDICT_ROW), ("residual", RESIDUAL_ROW))
            for value in [value for name, value in rows if name in (key, label)][:1]]
    explanations = [(f"{EXPLANATION_ROW} {number}", str(value)) for number, (_, value)
                    in enumerate([row for row in rows if _is_explanation(row[0])], start=1)]
    evidence = [row for row in rows if row[0] not in ("verdict", VERDICT_ROW, "residual", RESIDUAL_ROW,
                                                      "explanations") and not _is_explanation(row[0])]
    return lead + explanations + evidence


def scores_verdict(scores: Mapping) -> Optional[str]:
    """The verdict in ``scores`` (nested, flattened or read from a table), or None."""
    for key in ("verdict", VERDICT_ROW):
        if scores.get(key) not in (None, ""):
            return str(scores[key])
    return None


def scores_table_node(scene, scores: Mapping, name: str = "AnonMRI scores", table_node=None):
    """A ``vtkMRMLTableNode`` of :func:`scores_table_rows`: columns ``Score`` (the row's name),
    ``Value`` (numbers) and ``Text`` (text: the verdict, its explanations, notes).

    The first row is the verdict ("Verdict", the library's sentence as it is), so one line says
    whether the face is recognisable; the outline residual ("Residual") and the evidence follow.
    """
    import vtk

    rows = scores_table_rows(scores)
    if table_node is None:
        table_node = scene.AddNewNodeByClass("vtkMRMLTableNode", scene.GenerateUniqueName(name))
    was_modifying = table_node.StartModify()
    try:
        table = vtk.vtkTable()
        names = vtk.vtkStringArray()
        names.SetName("Score")
        values = vtk.vtkDoubleArray()
        values.SetName("Value")
        texts = vtk.vtkStringArray()
        texts.SetName("Text")
        for key, value in rows:
            names.InsertNextValue(key)
            if isinstance(value, float):
                values.InsertNextValue(value)
                texts.InsertNextValue("")
            else:
                values.InsertNextValue(float("nan"))
                texts.InsertNextValue(value)
        table.AddColumn(names)
        table.AddColumn(values)
        if any(isinstance(value, str) for _, value in rows):
            table.AddColumn(texts)
        table_node.SetAndObserveTable(table)
    finally:
        table_node.EndModify(was_modifying)
    return table_node


def scores_from_table_node(table_node) -> Dict[str, Union[float, str]]:
    """The ``{score: value}`` a :func:`scores_table_node` table holds (its row names: "Verdict",
    "Residual", "Explanation 1", ..., then flattened names)."""
    table = table_node.GetTable()
    names = table.GetColumnByName("Score")
    values = table.GetColumnByName("Value")
    texts = table.GetColumnByName("Text")
    result: Dict[str, Union[float, str]] = {}
    if names is None or values is None:
        return result
    for row in range(table.GetNumberOfRows()):
        value = values.GetValue(row)
        if texts is not None and texts.GetValue(row):
            result[names.GetValue(row)] = texts.GetValue(row)
        else:
            result[names.GetValue(row)] = float(value)
    return result


def node_names(nodes: Iterable) -> List[str]:
    """Names of MRML nodes (for messages)."""
    return [node.GetName() for node in nodes if node is not None]


def dicom_slice_thickness(volume_node, database=None) -> Optional[float]:
    """SliceThickness (0018,0050, mm) of the DICOM series a volume node was loaded from: read from
    ``database`` (default: Slicer's ``slicer.dicomDatabase``) for the node's first
    ``DICOM.instanceUIDs``; None when the node is not from DICOM, the database is not there or the
    value is not a positive number."""
    if volume_node is None:
        return None
    uids = (volume_node.GetAttribute("DICOM.instanceUIDs") or "").split()
    if database is None:
        try:
            import slicer

            database = getattr(slicer, "dicomDatabase", None)
        except ImportError:
            database = None
    if not uids or database is None:
        return None
    try:
        value = float(str(database.instanceValue(uids[0], "0018,0050")).split("\\")[0])
    except (ValueError, TypeError, AttributeError):
        return None
    return value if 0.0 < value < 100.0 else None
