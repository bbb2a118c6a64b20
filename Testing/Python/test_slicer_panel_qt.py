"""The panel's .ui loaded by Qt (PySide6 QUiLoader, offscreen), Slicer/CTK classes mapped to their Qt
bases as in docs/make_slicer_panel_screenshot.py: the steps appear top to bottom in the working
order, every bound widget exists, and the panel fits Slicer's module panel width.

Needs ``pip install PySide6-Essentials==6.12.0`` (the ``panel`` extra); skipped without it.
"""
import importlib.util
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UI_FILE = ROOT / "AnonMRI" / "Resources" / "UI" / "AnonMRI.ui"


def _screenshot_module():
    spec = importlib.util.spec_from_file_location("make_slicer_panel_screenshot",
                                                  ROOT / "docs" / "make_slicer_panel_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def panel():
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    pytest.importorskip("PySide6.QtUiTools", reason="needs PySide6-Essentials (pip install -e '.[panel]')")
    from PySide6 import QtCore, QtWidgets
    from PySide6.QtUiTools import QUiLoader

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    buffer = QtCore.QBuffer()
    buffer.setData(_screenshot_module().qt_only_ui(UI_FILE.read_text(encoding="utf-8")).encode())
    buffer.open(QtCore.QIODevice.OpenModeFlag.ReadOnly)
    widget = QUiLoader().load(buffer)
    assert widget is not None
    widget.resize(400, widget.sizeHint().height())
    widget.show()
    app.processEvents()
    yield widget
    widget.close()


def test_steps_are_laid_out_top_to_bottom_in_working_order(panel):
    from PySide6 import QtWidgets

    titles = ["1. Load", "2. Method", "3. Preview", "4. Apply", "5. Compare", "6. Export and scores"]
    boxes = {box.title(): box for box in panel.findChildren(QtWidgets.QGroupBox)}
    tops = [boxes[title].geometry().top() for title in titles]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)
    for title in titles:
        assert boxes[title].isVisible() and boxes[title].height() > 20


def test_every_bound_widget_is_created_and_the_panel_fits_a_module_panel(panel):
    from PySide6 import QtWidgets

    bound = [w.get("name") for w in ET.parse(UI_FILE).getroot().iter("widget")
             if any(p.get("name") == "SlicerParameterName" for p in w.findall("property"))]
    for name in bound:
        assert panel.findChild(QtWidgets.QWidget, name) is not None, name
    assert panel.minimumSizeHint().width() <= 450  # Slicer's module panel is about 400-450 px wide
    apply_button = panel.findChild(QtWidgets.QPushButton, "applyButton")
    cancel_button = panel.findChild(QtWidgets.QPushButton, "cancelButton")
    assert not apply_button.isEnabled() and not cancel_button.isEnabled()  # enabled by the module


def test_other_contrasts_sit_in_the_load_step_below_the_lesion_segmentation_one_row_each(panel):
    from PySide6 import QtWidgets

    boxes = {box.title(): box for box in panel.findChildren(QtWidgets.QGroupBox)}
    load, others = boxes["1. Load"], boxes["Other contrasts of this patient"]
    assert load.isAncestorOf(others)
    lesion = panel.findChild(QtWidgets.QWidget, "lesionSegmentationSelector")
    assert others.mapTo(load, others.rect().topLeft()).y() > lesion.mapTo(load, lesion.rect().bottomLeft()).y()
    rows = [others.findChild(QtWidgets.QWidget, name) for name in ["inputContrastComboBox"] + [
        f"otherVolume{n}Selector" for n in (1, 2, 3)]]
    tops = [row.mapTo(others, row.rect().topLeft()).y() for row in rows]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)
    for number in (1, 2, 3):  # each volume with its contrast on the same row, to its right
        volume = others.findChild(QtWidgets.QWidget, f"otherVolume{number}Selector")
        contrast = others.findChild(QtWidgets.QWidget, f"otherContrast{number}ComboBox")
        assert abs(volume.geometry().center().y() - contrast.geometry().center().y()) <= 2
        assert contrast.geometry().left() >= volume.geometry().right()
