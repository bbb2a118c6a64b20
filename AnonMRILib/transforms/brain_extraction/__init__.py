"""Brain-extraction backends behind :func:`AnonMRILib.transforms.brain_mask.brain_mask`.

- :mod:`.hdbet`: HD-BET's U-Net, one fold (weights shipped as safetensors), the default;
- :mod:`.deepbet`: deepbet's two LinkNet3d networks (weights shipped as safetensors), the fast one;
- :mod:`.common`: the steps they share (RAS reorientation, model cards, connected components);
- :mod:`.atlas`: SimpleITK registration of the embedded sample head and its ROBEX mask (no network).
Each backend module exposes ``compute_brain_mask(volume, progress, ...) -> numpy bool array`` on
the volume's own voxel grid.
"""
