"""Screenshot of the AnonMRI panel: its real ``.ui`` file, filled by a real run, grabbed offscreen.

What it is, exactly: 3D Slicer cannot be installed here, so the panel's Qt Designer file
``AnonMRI/Resources/UI/AnonMRI.ui`` is loaded with PySide6's ``QUiLoader`` after replacing the
Slicer/CTK widget classes by the Qt classes they derive from (``ctkCollapsibleButton`` -> a
``QGroupBox`` with the same title, ``qMRMLNodeComboBox`` -> ``QComboBox``, ``ctkPathLineEdit`` ->
``QLineEdit``, ``ctkSliderWidget`` -> ``QSlider``, ``qMRMLTableView`` -> ``QTableView``,
``qMRMLWidget`` -> ``QWidget``). The widgets are filled from a real run of the module's code on
the embedded sample head (``AnonMRIModuleLib`` with ``slicer-core`` MRML nodes: REFACE
in a separate worker process, the face renderings, the scores with their verdict), then grabbed with Qt's offscreen
platform. Layout, order, texts, tooltips and enabled states are the .ui's; Slicer's own styling
(and its collapsible-button look) is not::

    pip install -e ".[panel]"                   # PySide6-Essentials; not a runtime dependency
    QT_QPA_PLATFORM=offscreen python docs/make_slicer_panel_screenshot.py --out docs/slicer-panel.png
"""
import argparse
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "AnonMRI")]
UI_FILE = ROOT / "AnonMRI" / "Resources" / "UI" / "AnonMRI.ui"

#: Slicer/CTK class -> the Qt class it derives from
QT_BASE = {"qMRMLWidget": "QWidget", "ctkCollapsibleButton": "QGroupBox", "qMRMLNodeComboBox": "QComboBox",
           "ctkPathLineEdit": "QLineEdit", "ctkSliderWidget": "QSlider", "qMRMLTableView": "QTableView"}


def qt_only_ui(text: str) -> str:
    """The .ui with Slicer/CTK classes replaced by Qt ones (collapsible-button text -> group-box title)."""
    text = re.sub(r"<customwidgets>.*?</customwidgets>", "", text, flags=re.S)
    text = re.sub(r"<connections>.*?</connections>", "<connections/>", text, flags=re.S)

    def group_box(match):
        block = match.group(0)
        return block.replace('<property name="text">', '<property name="title">', 1)

    text = re.sub(r'<widget class="ctkCollapsibleButton" name="\w+">\s*<property name="text">', group_box, text)
    for slicer_class, qt_class in QT_BASE.items():
        text = text.replace(f'class="{slicer_class}"', f'class="{qt_class}"')
    return text


def run_sample():
    """The module's code on the sample head: REFACE in a worker process, renderings, scores."""
    import slicer

    from AnonMRIModuleLib import core, jobs, mrml
    from AnonMRIModuleLib.tasks import ProcessTask

    scene = slicer.vtkMRMLScene()
    logic = core.AnonMRILogicCore(scene)
    head, brain = logic.loadSample()
    request = logic.prepare(core.REFACE_LABEL, head, brain, device="cpu", seed=0, checkBrainMask=False)
    start = time.monotonic()
    task = ProcessTask(*jobs.request_job(request)).start()
    result = task.run()
    seconds = time.monotonic() - start
    output = logic.addOutput(request, result["output"], head)
    images = jobs.render({"image": mrml.volume_from_node(head), "output": mrml.volume_from_node(output)},
                         {"view": "anterior", "size": 256, "device": "cpu"})
    scores = logic.scores(head, output, brain)
    table = logic.scoresTable(scores)
    return {"input": head.GetName(), "brain": brain.GetName(), "output": output.GetName(), "seconds": seconds,
            "images": [images["image_0"], images["image_1"]], "scores": mrml.scores_table_rows(scores),
            "verdict": core.scores_summary(scores), "table": table.GetName()}


def pixmap(QtGui, image, size=170):
    data = np.ascontiguousarray((np.clip(image, 0, 1) * 255).astype(np.uint8))
    height, width = data.shape
    qimage = QtGui.QImage(data.data, width, height, width, QtGui.QImage.Format.Format_Grayscale8).copy()
    return QtGui.QPixmap.fromImage(qimage).scaled(size, size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "slicer-panel.png")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6 import QtCore, QtGui, QtWidgets
    from PySide6.QtUiTools import QUiLoader

    from AnonMRIModuleLib import core

    run = run_sample()
    app = QtWidgets.QApplication([])
    buffer = QtCore.QBuffer()
    buffer.setData(qt_only_ui(UI_FILE.read_text(encoding="utf-8")).encode())
    buffer.open(QtCore.QIODevice.OpenModeFlag.ReadOnly)
    panel = QUiLoader().load(buffer)
    find = lambda cls, name: panel.findChild(cls, name)  # noqa: E731

    others = range(1, core.MAX_OTHER_CONTRASTS + 1)
    combos = {"inputVolumeSelector": [run["input"]], "brainMaskSelector": [run["brain"]],
              "lesionSegmentationSelector": ["None"], "inputContrastComboBox": core.contrast_choices(),
              "methodComboBox": core.method_labels(),
              "deviceComboBox": ["auto", "cuda", "cpu"], "previewViewComboBox": ["anterior"],
              "outputVolumeSelector": [run["output"]], "exportFormatComboBox": core.export_formats(),
              "scoresTableSelector": [run["table"]]}
    for number in others:
        combos[f"otherVolume{number}Selector"] = ["None"]
        combos[f"otherContrast{number}ComboBox"] = core.contrast_choices()
    for name, items in combos.items():
        find(QtWidgets.QComboBox, name).addItems(items)
    find(QtWidgets.QComboBox, "deviceComboBox").setCurrentText("cpu")
    for name, checked in (("bundledWeightsCheckBox", True), ("checkBrainMaskCheckBox", True),
                          ("linkCamerasCheckBox", True)):
        find(QtWidgets.QCheckBox, name).setChecked(checked)
    find(QtWidgets.QComboBox, "methodComboBox").setCurrentText(core.REFACE_LABEL)
    find(QtWidgets.QDoubleSpinBox, "variationStrengthSpinBox").setValue(core.default_variation_strength())
    lesion_only = ["lesionSegmentationSelector", "weightsPathLineEdit", "lesionWeightsPathLineEdit",
                   "exactLesionCheckBox", "variationStrengthSpinBox", "samplingStepsSpinBox", "inputContrastComboBox"]
    lesion_only += [f"other{kind}{number}{widget}" for number in others
                    for kind, widget in (("Volume", "Selector"), ("Contrast", "ComboBox"))]
    for name in lesion_only + ["rotationsSpinBox", "bundledWeightsCheckBox"]:
        panel.findChild(QtWidgets.QWidget, name).setEnabled(False)  # as the module does for REFACE
    for name in ("applyButton", "computeScoresButton"):
        find(QtWidgets.QPushButton, name).setEnabled(True)
    find(QtWidgets.QLabel, "methodDescriptionLabel").setText(
        "Replaces the face, skull and scalp with a template head placed from the brain mask and hull alone; "
        "every brain voxel is kept bit for bit.")
    find(QtWidgets.QLabel, "deviceInfoLabel").setText(
        "torch installed; whether a CUDA GPU is usable is checked in the worker process.")
    find(QtWidgets.QProgressBar, "progressBar").setValue(1000)
    find(QtWidgets.QLabel, "statusLabel").setText(run["verdict"])
    find(QtWidgets.QLabel, "scoresVerdictLabel").setText(run["verdict"])
    slider = find(QtWidgets.QSlider, "fadeSliderWidget")
    slider.setOrientation(QtCore.Qt.Orientation.Horizontal)
    slider.setRange(0, 100)
    slider.setValue(50)
    for label, image in zip(("inputPreviewLabel", "outputPreviewLabel"), run["images"]):
        find(QtWidgets.QLabel, label).setPixmap(pixmap(QtGui, image))
    rows = list(run["scores"])
    model = QtGui.QStandardItemModel(len(rows), 2)
    model.setHorizontalHeaderLabels(["Score", "Value"])
    for row, (name, value) in enumerate(rows):
        model.setItem(row, 0, QtGui.QStandardItem(name))
        model.setItem(row, 1, QtGui.QStandardItem(f"{value:.4g}" if isinstance(value, float) else str(value)))
    view = find(QtWidgets.QTableView, "scoresTableView")
    view.setModel(model)
    view.resizeColumnsToContents()
    panel.resize(420, panel.sizeHint().height())
    app.processEvents()
    panel.grab().save(str(args.out))
    print(f"{args.out}: {panel.width()}x{panel.height()}, REFACE in a worker process {run['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
