"""Long work in a separate process (AnonMRILib.worker + AnonMRIModuleLib.tasks), with real MRML nodes.

The panel's QTimer is replaced by the test's own loop calling :meth:`JobPoller.tick` every 100 ms on
the main thread; the gaps between ticks are measured while a CP-GAN remodel runs in the worker.
"""
import os
import stat
import sys
import time

import numpy as np
import pytest

from AnonMRILib.errors import DependencyError, InputError
from AnonMRILib.worker import event_line, parse_line
from AnonMRIModuleLib import core, jobs, mrml
from AnonMRIModuleLib.tasks import CANCELLED, DONE, FAILED, JobPoller, ProcessTask, python_executable
from slicer_helpers import require_slicer_core, rotated_affine, synthetic_head

slicer = require_slicer_core()  # skips this module without slicer-core


class FakeTimer:
    """Stands in for qt.QTimer: the poller starts and stops it; the test loop delivers the ticks."""

    def __init__(self):
        self.active = False

    def start(self):
        self.active = True

    def stop(self):
        self.active = False


def _run_timer(poller, timer, interval_s=0.1, timeout_s=120.0):
    """Tick like a 100 ms QTimer on this (the main) thread; returns the tick times."""
    ticks = [time.monotonic()]
    deadline = ticks[0] + timeout_s
    while timer.active and time.monotonic() < deadline:
        next_tick = ticks[-1] + interval_s
        time.sleep(max(0.0, next_tick - time.monotonic()))
        ticks.append(time.monotonic())
        poller.tick()
    assert not timer.active, "the job did not finish in time"
    return np.array(ticks)


@pytest.fixture
def head_nodes(scene):
    head, brain = synthetic_head(affine=rotated_affine(spacing=(3.0, 3.0, 3.0)))
    head_node = mrml.add_volume_node(scene, head, "Doe^Jane 1970-01-01 T1w")
    brain_node = mrml.add_volume_node(scene, brain, "Doe^Jane brain", labelmap=True)
    return head, brain, head_node, brain_node


def test_event_lines_round_trip_and_log_lines_are_not_events():
    line = event_line("progress", fraction=0.5, message="half")
    assert parse_line(line + "\n") == {"event": "progress", "fraction": 0.5, "message": "half"}
    assert parse_line("UserWarning: something") is None
    assert parse_line("ANONMRI {not json") is None


def test_python_executable_prefers_a_given_pythonslicer_then_this_python(tmp_path):
    fake = tmp_path / "PythonSlicer"
    fake.write_text("")
    assert python_executable([str(tmp_path / "missing"), str(fake)]) == str(fake)
    assert python_executable([str(tmp_path / "missing")]) == sys.executable  # outside Slicer


def test_remodel_in_a_separate_process_keeps_the_main_thread_timer_ticking(scene, head_nodes, tmp_path):
    """The panel's path: request -> job folder -> worker process -> result node; GUI timer <= 150 ms."""
    head, brain, head_node, brain_node = head_nodes
    logic = core.AnonMRILogicCore(scene)
    request = logic.prepare(core.REMODEL_LABEL, head_node, brain_node, device="cpu", seed=3, checkBrainMask=False)
    entry, volumes, options = jobs.request_job(request)
    task = ProcessTask(entry, volumes, options, temporary_parent=str(tmp_path))
    timer = FakeTimer()
    poller = JobPoller(timer)
    seen, finished = [], []
    task.start()
    folder = task.folder
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert sorted(os.listdir(folder)) == ["brain_mask.volume.json", "brain_mask.volume.npy", "image.volume.json",
                                          "image.volume.npy", "job.json"]  # neutral names
    poller.add(task, "anonymize", lambda result, status: finished.append(result),
               on_status=lambda status: seen.append(status.fraction))
    ticks = _run_timer(poller, timer)
    gaps = np.diff(ticks)
    print(f"remodel in a worker process: {ticks[-1] - ticks[0]:.1f} s, {len(gaps)} ticks, "
          f"largest gap {1000 * gaps.max():.0f} ms")
    assert gaps.max() <= 0.150
    assert task.status().state == DONE, task.error_traceback
    assert any(0.0 < f < 1.0 for f in seen) and seen == sorted(seen)  # progress came from the process
    assert not folder.exists() and os.listdir(tmp_path) == []  # nothing of the patient is left
    output = finished[0]["output"]
    np.testing.assert_array_equal(output.affine, head.affine)  # the job files are exact both ways
    assert output.dtype == head.dtype
    node = logic.addOutput(request, output)
    assert node.GetName() == "Anonymized 1 (CP-GAN)"
    result = mrml.volume_from_node(node)
    inside = brain.array > 0
    np.testing.assert_array_equal(result.array[inside], head.array[inside])
    assert (result.array[~inside] != head.array[~inside]).mean() > 0.05


def test_cancel_kills_the_worker_within_a_second_and_leaves_no_file(head_nodes, tmp_path):
    head, brain, head_node, brain_node = head_nodes
    request = core.AnonymizationRequest(operation=core.REMODEL, image=head, brain_mask=brain, device="cpu",
                                        check_brain_mask=False)
    task = ProcessTask(*jobs.request_job(request), temporary_parent=str(tmp_path)).start()
    deadline = time.monotonic() + 60
    while task.status().fraction <= 0.0 and time.monotonic() < deadline:  # the worker is computing
        time.sleep(0.05)
    process = task.process
    assert process.poll() is None
    start = time.monotonic()
    task.cancel()
    elapsed = time.monotonic() - start
    assert process.poll() is not None and elapsed < 1.0
    assert task.status().state == CANCELLED and task.result is None
    assert os.listdir(tmp_path) == []


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat_file:  # a zombie waiting for its reaper is dead too
        return stat_file.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
def test_cancel_kills_the_whole_process_tree(tmp_path):
    helpers = os.path.dirname(os.path.abspath(__file__))
    task = ProcessTask("slicer_helpers:spawn_child_and_wait", {}, {}, python_path=[helpers],
                       temporary_parent=str(tmp_path)).start()
    deadline = time.monotonic() + 60
    while not task.status().message and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(task.status().message)
    assert _alive(child) and _alive(task.process.pid)
    start = time.monotonic()
    task.cancel()
    while _alive(child) and time.monotonic() - start < 1.0:
        time.sleep(0.02)
    assert not _alive(child), "the worker's child process survived Cancel"
    assert task.process.poll() is not None and time.monotonic() - start < 1.0
    assert os.listdir(tmp_path) == []


def test_a_library_error_in_the_worker_comes_back_as_the_same_error_class(head_nodes, tmp_path):
    head, _, _, _ = head_nodes
    request = core.AnonymizationRequest(operation=core.DEFACE, method="no-such-method", image=head,
                                        brain_mask=head.with_array((head.array > 400).astype(np.uint8)),
                                        check_brain_mask=False)
    task = ProcessTask(*jobs.request_job(request), temporary_parent=str(tmp_path)).start()
    assert task.wait(120)
    assert task.status().state == FAILED
    assert isinstance(task.error, InputError) and "no-such-method" in str(task.error)
    assert "Traceback" in task.error_traceback
    assert os.listdir(tmp_path) == []
    with pytest.raises(InputError):
        task.run()


def test_poller_calls_on_end_for_a_cancelled_job_and_stops_its_timer(head_nodes, tmp_path):
    head, _, _, _ = head_nodes
    task = ProcessTask(jobs.RENDER, {"image": head}, {"size": 32}, temporary_parent=str(tmp_path)).start()
    timer, ended = FakeTimer(), []
    poller = JobPoller(timer)
    poller.add(task, "preview", lambda result, status: None, on_end=lambda t, status: ended.append(status.state))
    assert poller.job("preview") is task and timer.active
    poller.cancel_all()
    poller.tick()
    assert ended == [CANCELLED] and not timer.active and poller.job("preview") is None
    assert os.listdir(tmp_path) == []


BLOCK_TORCH = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "monai"):
            raise ImportError("no " + name + " in this test")
sys.meta_path.insert(0, Block())
sys.argv = ["AnonMRILib.worker", sys.argv[1]]
runpy.run_module("AnonMRILib.worker", run_name="__main__")
"""


class NoTorchTask(ProcessTask):
    """The worker started in a Python where torch and MONAI cannot be imported."""

    def command(self, job_path):
        return [sys.executable, "-c", BLOCK_TORCH, str(job_path)]


def test_a_removal_method_with_a_brain_mask_runs_in_a_worker_without_torch(tmp_path):
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    head, brain = load_sample_head(), load_sample_brain_mask()
    method = "quickshear" if "quickshear" in core.removal_methods() else core.removal_methods()[0]
    request = core.AnonymizationRequest(operation=core.DEFACE, method=method, image=head, brain_mask=brain,
                                        check_brain_mask=False)
    task = NoTorchTask(*jobs.request_job(request), temporary_parent=str(tmp_path)).start()
    assert task.wait(120)
    assert task.status().state == DONE, task.error_traceback
    output = task.result["output"]
    np.testing.assert_array_equal(output.array[brain.array > 0], head.array[brain.array > 0])
    assert not np.array_equal(output.array, head.array)
    # the same worker refuses a learned method there, with the library's clear error
    request = core.AnonymizationRequest(operation=core.REMODEL, image=head, brain_mask=brain, check_brain_mask=False)
    failed = NoTorchTask(*jobs.request_job(request), temporary_parent=str(tmp_path)).start()
    assert failed.wait(120) and failed.status().state == FAILED
    assert isinstance(failed.error, DependencyError) and "torch" in str(failed.error)
    assert os.listdir(tmp_path) == []
