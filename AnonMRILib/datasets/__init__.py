"""Data for training and evaluation: a generated population of heads and loaders of real T1 folders.

* :mod:`.population` turns a few real heads into many "subjects" and "scans" (smooth face and
  skull variation, intensity, bias field, noise, pose) with the brain kept rigid;
* :mod:`.t1_folders` finds T1w NIfTI files in a BIDS dataset (OASIS-3) or an ADNI-style folder
  and splits them by patient.
"""
