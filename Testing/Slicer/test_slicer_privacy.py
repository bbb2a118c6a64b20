"""No patient data in names, files or the subject hierarchy of AnonMRI's results (real MRML nodes).

A scene is built the way Slicer's DICOM module leaves it: a patient item carrying the patient's
name, ID and birth date, a study item with its UIDs, the volume (named after the patient) under the
study with its instance UIDs. After anonymizing and exporting, none of those values may appear in
any exported file (raw bytes, and decompressed), node name or default file name.
"""
import gzip

import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io.readers import load_volume
from AnonMRIModuleLib import core, mrml
from slicer_helpers import require_slicer_core

slicer = require_slicer_core()  # skips this module without slicer-core

PLANTED = {
    "DICOM.PatientName": "MUSTERMANN^ERIKA",
    "DICOM.PatientID": "PID-4711-0815",
    "DICOM.PatientBirthDate": "19640812",
    "DICOM.PatientSex": "F",
    "DICOM.StudyInstanceUID": "1.2.826.0.1.3680043.8.498.10448211981577",
    "DICOM.StudyDate": "20210317",
    "DICOM.StudyDescription": "MRT SCHAEDEL NATIV",
}
SERIES_UID = "1.2.826.0.1.3680043.8.498.77331234567890"
INSTANCE_UIDS = "1.2.826.0.1.3680043.8.498.5551.1 1.2.826.0.1.3680043.8.498.5551.2"
NODE_NAME = "3: MUSTERMANN^ERIKA PID-4711-0815 19640812 T1 MPRAGE"
#: every value that must not leave the original's branch (the sex letter alone is too short to search)
SECRETS = [v for k, v in PLANTED.items() if k != "DICOM.PatientSex"] + [SERIES_UID, INSTANCE_UIDS.split()[0],
                                                                         "MUSTERMANN", "4711", "1964"]


@pytest.fixture
def dicom_scene(scene):
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    head = mrml.add_volume_node(scene, load_sample_head(), NODE_NAME)
    head.SetAttribute("DICOM.instanceUIDs", INSTANCE_UIDS)
    head.SetAttribute("DICOM.Modality", "MR")
    brain = mrml.add_volume_node(scene, load_sample_brain_mask(), "MUSTERMANN brain", labelmap=True)
    sh = slicer.vtkMRMLSubjectHierarchyNode.GetSubjectHierarchyNode(scene)
    patient = sh.CreateSubjectItem(sh.GetSceneItemID(), "MUSTERMANN^ERIKA")
    study = sh.CreateStudyItem(patient, "MRT SCHAEDEL NATIV 20210317")
    for key, value in PLANTED.items():
        sh.SetItemAttribute(patient if key.startswith("DICOM.Patient") else study, key, value)
    series = sh.CreateItem(study, head)
    sh.SetItemUID(series, "DICOM", SERIES_UID)
    sh.CreateItem(study, brain)
    return scene, head, brain, sh, patient


def _ancestors(sh, item):
    found = []
    while item:
        item = sh.GetItemParent(item)
        found.append(item)
    return found


def _assert_no_secret(data: bytes, where: str):
    for secret in SECRETS:
        assert secret.encode() not in data, f"{secret!r} found in {where}"


def test_anonymize_then_export_carries_no_planted_patient_value(dicom_scene, tmp_path):
    scene, head, brain, sh, patient = dicom_scene
    logic = core.AnonMRILogicCore(scene)
    method = "quickshear" if "quickshear" in core.removal_methods() else core.removal_methods()[0]
    output = logic.deface(head, method, brain)
    segmentation = logic.addBrainMask(mrml.mask_from_node(brain, head), output, head)
    table = logic.scoresTable({"face.changed_fraction": 0.5})

    # neutral names, default file names and subject-hierarchy place of every result
    assert output.GetName() == f"Anonymized 1 ({method})"
    assert segmentation.GetName() == "Brain mask 1" and table.GetName() == "Scores 1"
    for node in (output, segmentation, table):
        storage = node.GetStorageNode()
        assert storage is not None and storage.GetFileName()
        texts = [node.GetName(), storage.GetFileName()] + [
            node.GetAttribute(name) or "" for name in node.GetAttributeNames()]
        _assert_no_secret("\n".join(texts).encode(), f"{node.GetName()}'s names and attributes")
        item = sh.GetItemByDataNode(node)
        assert item and patient not in _ancestors(sh, item)
        assert sh.GetItemName(sh.GetItemParent(item)) == core.RESULTS_FOLDER
    assert output.GetStorageNode().GetFileName() == f"Anonymized_1_{method}.nrrd"

    # export: only the anonymized voxels and geometry
    formats = core.export_formats()
    assert formats[:3] == [".nii.gz", ".nii", ".nrrd"]
    anonymized = mrml.volume_from_node(output)
    for suffix in (".nii.gz", ".nrrd"):
        path = tmp_path / ("export" + suffix)
        written = logic.exportAnonymized(output, str(path))
        data = path.read_bytes()
        _assert_no_secret(data, written)
        if suffix.endswith(".gz"):
            _assert_no_secret(gzip.decompress(data), written + " (decompressed)")
        back = load_volume(path)
        np.testing.assert_array_equal(back.array, anonymized.array)
        np.testing.assert_allclose(back.affine, anonymized.affine, atol=1e-4)
    with pytest.raises(InputError, match="only an anonymized volume"):
        logic.exportAnonymized(head, str(tmp_path / "original.nii.gz"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.nii.gz", "export.nrrd"]

    # what a saved scene would still hold of the original is listed (without the values)
    found = logic.originalDataInScene()
    assert any("input volume" in text for text in found)
    assert any("DICOM.PatientName" in text for text in found)
    _assert_no_secret("\n".join(found).encode(), "the warning text")
