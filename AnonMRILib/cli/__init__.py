"""The ``anonmri`` command line (also ``python -m AnonMRILib``)."""
