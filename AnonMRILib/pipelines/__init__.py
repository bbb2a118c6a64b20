"""Pipelines: remodel_face, anonymize_lesions and the removal baselines (input Volume in, Volume on its grid out)."""
