"""De-identification method codes (DICOM PS3.16 CID 7050) shared by DICOM output and BIDS sidecars.

DICOM (0012,0064) De-identification Method Code Sequence and the BIDS sidecar key
``DeidentificationMethodCodeSequence`` use the same DCM codes: 113100 for the Basic Application
Level Confidentiality Profile, 113102 for its Clean Recognizable Visual Features option (the face
is treated), and one code per further option applied.
"""
from typing import Dict, Iterable, List

#: DCM code value -> code meaning (PS3.16 CID 7050 "De-identification Method")
CODE_MEANINGS: Dict[str, str] = {
    "113100": "Basic Application Confidentiality Profile",
    "113101": "Clean Pixel Data Option",
    "113102": "Clean Recognizable Visual Features Option",
    "113103": "Clean Graphics Option",
    "113104": "Clean Structured Content Option",
    "113105": "Clean Descriptors Option",
    "113106": "Retain Longitudinal Temporal Information Full Dates Option",
    "113107": "Retain Longitudinal Temporal Information Modified Dates Option",
    "113108": "Retain Patient Characteristics Option",
    "113109": "Retain Device Identity Option",
    "113110": "Retain UIDs Option",
    "113111": "Retain Safe Private Option",
    "113112": "Retain Institution Identity Option",
}
BASIC_PROFILE = "113100"
CLEAN_VISUAL_FEATURES = "113102"
#: what every AnonMRI output has had applied (headers built from scratch, face treated)
DEFAULT_CODES = (BASIC_PROFILE, CLEAN_VISUAL_FEATURES)


def method_codes(extra: Iterable[str] = ()) -> List[Dict[str, str]]:
    """The code items (CodeValue, CodingSchemeDesignator, CodeMeaning) of the default codes plus ``extra``."""
    values = list(DEFAULT_CODES) + [c for c in extra if c not in DEFAULT_CODES]
    unknown = [c for c in values if c not in CODE_MEANINGS]
    if unknown:
        raise ValueError(f"unknown de-identification method code(s): {', '.join(unknown)}")
    return [{"CodeValue": c, "CodingSchemeDesignator": "DCM", "CodeMeaning": CODE_MEANINGS[c]} for c in values]


#: human-readable DeidentificationMethod per AnonMRI method
METHOD_DESCRIPTIONS: Dict[str, str] = {
    "remodel": "AnonMRI CP-GAN face remodeling: face, skull, scalp and neck inside the head's convex hull "
               "regenerated, brain voxels kept bit for bit",
    "lesion": "AnonMRI lesion-preserving latent-diffusion anonymization: non-lesion anatomy regenerated, "
              "lesion latent kept",
}


def method_description(method: str) -> str:
    """DeidentificationMethod text for an AnonMRI method name (removal baselines named by their method)."""
    from .. import __version__

    text = METHOD_DESCRIPTIONS.get(method, f"AnonMRI {method} face removal baseline, brain voxels kept bit for bit")
    return f"{text} (anonmri {__version__})"
