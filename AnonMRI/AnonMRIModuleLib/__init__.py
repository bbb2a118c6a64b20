"""Qt-free helpers of the AnonMRI Slicer module.

Everything here needs only ``vtk`` and the MRML classes (``slicer`` as provided by Slicer or by
Kitware's ``slicer-core`` wheel), never Qt, ``slicer.app`` or ``slicer.util``, so the module's logic
can be tested without a Slicer application:

- :mod:`.mrml`: MRML volume / labelmap / segmentation nodes <-> :class:`AnonMRILib.io.Volume`,
  score tables;
- :mod:`.core`: the scene-level logic (``remodelFace``, ``anonymizeLesions``, ``deface``,
  ``renderFace``, ``scores``) split into a main-thread part (MRML) and a worker part (library);
- :mod:`.tasks`: long work in a separate Python process (progress, cancel = kill), polled by the
  panel's QTimer through an injected timer;
- :mod:`.jobs`: the entries that process runs (the same functions as the console API);
- :mod:`.render3d`: face volume rendering in Slicer's 3D views and offscreen;
- :mod:`.dependencies`: which Python packages the library needs and which are missing.

This is a sub-package (not a top-level ``.py`` of the module folder) so that Slicer does not try to
load these files as modules when the folder is added through "Additional module paths".
"""
