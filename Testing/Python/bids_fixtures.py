"""A generated two-subject BIDS dataset (T1w + T2w per session) built from the embedded sample head."""
import json
from pathlib import Path

import numpy as np

from AnonMRILib.io import save_volume

from dicom_fixtures import small_sample
from multicontrast_fixtures import t2_like


def make_bids_dataset(root: Path, step: int = 3):
    """(BIDS root, brain-mask derivative root): sub-01 with ses-1, sub-02 without sessions; 4.5 mm heads."""
    bids, masks = root / "bids", root / "masks"
    bids.mkdir(parents=True)
    (bids / "dataset_description.json").write_text(json.dumps({"Name": "tiny", "BIDSVersion": "1.9.0",
                                                               "License": "CC0"}))
    head, brain = small_sample(step=step)
    subjects = {"sub-01/ses-1/anat/sub-01_ses-1": (head, 4.0), "sub-02/anat/sub-02": (
        head.with_array(np.rint(head.array * 1.3).astype(head.dtype)), -5.0)}
    for prefix, (t1, angle) in subjects.items():
        anat = bids / Path(prefix).parent
        anat.mkdir(parents=True)
        save_volume(t1, bids / f"{prefix}_T1w.nii.gz")
        (bids / f"{prefix}_T1w.json").write_text(json.dumps({"RepetitionTime": 2.3, "InstitutionName": "St Elsewhere"}))
        t2, _ = t2_like(t1, angle_deg=angle)
        save_volume(t2, bids / f"{prefix}_T2w.nii.gz")
        (masks / Path(prefix).parent).mkdir(parents=True)
        save_volume(brain, masks / f"{prefix}_desc-brain_mask.nii.gz")
    return bids, masks
