"""The removal baselines' algorithms, one module each; the entry point is
:func:`AnonMRILib.pipelines.baselines.deface`.

* :mod:`.quickshear` - QUICKSHEAR (Schimke et al. 2011), in world coordinates
* :mod:`.face_blur` - FACE MASK (after Milchenko & Marcus 2013) and whole-head blur
* :mod:`.template_deface` - DEFACE: pydeface's template registered with SimpleITK
* :mod:`.brain_only` - skull stripping and BLACK
"""
