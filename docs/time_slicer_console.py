"""Time the module's console API calls on the embedded sample head (slicer-core MRML scene, CPU).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=.:AnonMRI nice -n 10 python docs/time_slicer_console.py

Prints one line per call, in this order (the first remodel pays for importing torch and MONAI);
the README's "3D Slicer extension" section quotes a run of it.
"""
import time


def timed(label, function):
    start = time.perf_counter()
    result = function()
    print(f"{label} {time.perf_counter() - start:.1f} s", flush=True)
    return result


def main() -> None:
    import slicer

    from AnonMRIModuleLib import core, jobs
    from AnonMRIModuleLib.tasks import ProcessTask

    logic = core.AnonMRILogicCore(slicer.vtkMRMLScene())
    head, brain = timed("loadSample()", logic.loadSample)
    out = timed("remodelFace(head, brain, device='cpu')", lambda: logic.remodelFace(head, brain, device="cpu"))
    timed("remodelFace(head, brain, device='cpu') again (warm)", lambda: logic.remodelFace(head, brain, device="cpu"))
    timed("deface(head, 'quickshear', brain)", lambda: logic.deface(head, "quickshear", brain))
    timed("renderFace(out, size=256, device='cpu')", lambda: logic.renderFace(out, size=256, device="cpu"))
    timed("scores(head, out, brain)", lambda: logic.scores(head, out, brain))
    request = logic.prepare(core.REMODEL_LABEL, head, brain, device="cpu", checkBrainMask=False)
    timed("panel path: remodel in a worker process (ProcessTask)", lambda: ProcessTask(*jobs.request_job(request)).run())
    timed("remodelFace(head, device='cpu') without a mask (hdbet mask on the CPU)",
          lambda: logic.remodelFace(head, device="cpu"))


if __name__ == "__main__":
    main()
