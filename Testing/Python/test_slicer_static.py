"""Static checks of the Slicer extension (no Slicer needed): the .ui, the parameter node, CMake files.

- the panel's .ui is valid Qt Designer XML and every input widget is bound (``SlicerParameterName``)
  to a field of the ``parameterNodeWrapper`` class in ``AnonMRI/AnonMRI.py`` (read with ``ast``),
  with a widget type Slicer's GUI connectors can bind to that field's type, and every field is bound;
- every ``self.ui.<name>`` the module uses exists in the .ui;
- the top-level ``CMakeLists.txt`` has what the Slicer Extensions Index checks; the module's
  ``CMakeLists.txt`` builds every module file;
- ``AnonMRI.py`` parses as Python 3.9 (Slicer's Python).
"""
import ast
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE_DIR = ROOT / "AnonMRI"
MODULE_PY = MODULE_DIR / "AnonMRI.py"
UI_FILE = MODULE_DIR / "Resources" / "UI" / "AnonMRI.ui"
TOP_CMAKE = ROOT / "CMakeLists.txt"
MODULE_CMAKE = MODULE_DIR / "CMakeLists.txt"

#: widget class -> field types Slicer's parameterNodeWrapper GUI connectors bind it to
CONNECTABLE = {
    "QCheckBox": {"bool"},
    "QPushButton": {"bool"},
    "QSpinBox": {"int"},
    "QSlider": {"int"},
    "QDoubleSpinBox": {"float"},
    "ctkSliderWidget": {"float"},
    "QComboBox": {"str", "int", "float", "bool"},  # with a Choice annotation (checked below)
    "QLineEdit": {"str"},
    "QTextEdit": {"str"},
    "ctkPathLineEdit": {"pathlib.Path", "Path"},
    "ctkDirectoryButton": {"pathlib.Path", "Path"},
    "qMRMLNodeComboBox": {"node"},
}
INPUT_WIDGETS = set(CONNECTABLE) - {"QPushButton"}


def _module_tree():
    return ast.parse(MODULE_PY.read_text(encoding="utf-8"))


def _parameter_node_fields():
    """{field name: annotation AST} of the class decorated with @parameterNodeWrapper."""
    classes = [node for node in ast.walk(_module_tree()) if isinstance(node, ast.ClassDef)
               and any(ast.unparse(d) == "parameterNodeWrapper" for d in node.decorator_list)]
    assert len(classes) == 1, "AnonMRI.py must define exactly one @parameterNodeWrapper class"
    return {stmt.target.id: stmt.annotation for stmt in classes[0].body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}


def _base_type(annotation):
    """'int', 'str', 'bool', 'float', 'pathlib.Path' or 'node' for a field annotation; and its extras."""
    text = ast.unparse(annotation)
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("Annotated", "typing.Annotated"):
        elements = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        base, _ = _base_type(elements[0])
        return base, [ast.unparse(e) for e in elements[1:]]
    if "vtkMRML" in text or "SegmentationNode" in text:
        return "node", []
    return text, []


def _ui_root():
    return ET.parse(UI_FILE).getroot()


def _bound_widgets():
    """[(widget class, widget name, SlicerParameterName)] from the .ui."""
    bound = []
    for widget in _ui_root().iter("widget"):
        for prop in widget.findall("property"):
            if prop.get("name") == "SlicerParameterName":
                bound.append((widget.get("class"), widget.get("name"), prop.find("string").text))
    return bound


def test_ui_is_valid_designer_xml_with_a_mrml_widget_and_collapsible_sections():
    root = _ui_root()
    assert root.tag == "ui" and root.find("class").text == "AnonMRI"
    top = root.find("widget")
    assert top.get("class") == "qMRMLWidget" and top.get("name") == "AnonMRI"
    top_layout = root.find("widget/layout")
    sections = [item.find("widget") for item in top_layout.findall("item") if item.find("widget") is not None]
    titles = [w.find("property/string").text for w in sections if w.get("class") == "ctkCollapsibleButton"]
    # the steps in the order a radiologist works: load -> method -> preview -> apply -> compare -> export
    assert titles == ["1. Load", "2. Method", "3. Preview", "4. Apply", "5. Compare", "6. Export and scores"]
    assert "Advanced" in {w.find("property/string").text for w in root.iter("widget")
                          if w.get("class") == "ctkCollapsibleButton"}
    names = [w.get("name") for w in root.iter("widget")]
    assert len(names) == len(set(names)), "widget names must be unique"
    declared = {c.find("class").text for c in root.iter("customwidget")}
    used = {w.get("class") for w in root.iter("widget")}
    assert {c for c in used if c.startswith(("ctk", "qMRML"))} <= declared


def test_every_slicer_parameter_name_is_a_parameter_node_field_of_a_connectable_type():
    fields = _parameter_node_fields()
    bound = _bound_widgets()
    assert bound, "no widget is bound to the parameter node"
    for widget_class, widget_name, parameter in bound:
        assert parameter in fields, f"{widget_name}: SlicerParameterName {parameter!r} is not a parameter-node field"
        base, extras = _base_type(fields[parameter])
        assert widget_class in CONNECTABLE, f"{widget_name}: {widget_class} cannot be bound to a parameter"
        assert base in CONNECTABLE[widget_class], f"{widget_name} ({widget_class}) cannot show a {base} field"
        if widget_class == "QComboBox":
            assert any(e.startswith("Choice(") for e in extras), f"{parameter}: a QComboBox needs Choice(...)"
    names = [parameter for _, _, parameter in bound]
    assert len(names) == len(set(names)), "a parameter is bound to two widgets"
    assert set(names) == set(fields), f"fields without a widget: {set(fields) - set(names)}"


def test_every_input_widget_is_bound_and_node_selectors_get_the_scene():
    root = _ui_root()
    bound_names = {name for _, name, _ in _bound_widgets()}
    for widget in root.iter("widget"):
        if widget.get("class") in INPUT_WIDGETS:
            assert widget.get("name") in bound_names, f"{widget.get('name')} is an input without SlicerParameterName"
    scene_receivers = {c.find("receiver").text for c in root.iter("connection")
                       if c.find("signal").text == "mrmlSceneChanged(vtkMRMLScene*)"}
    for widget in root.iter("widget"):
        if widget.get("class", "").startswith("qMRML") and widget.get("class") != "qMRMLWidget":
            assert widget.get("name") in scene_receivers, f"{widget.get('name')} never gets the MRML scene"


def test_the_inputs_the_issue_asks_for_are_in_the_panel():
    fields = _parameter_node_fields()
    node_fields = {name: ast.unparse(a) for name, a in fields.items() if _base_type(a)[0] == "node"}
    assert "vtkMRMLScalarVolumeNode" in node_fields["inputVolume"]
    assert "LabelMapVolumeNode" in node_fields["brainMask"] and "SegmentationNode" in node_fields["brainMask"]
    assert "SegmentationNode" in node_fields["lesionSegmentation"]
    for name, annotation in node_fields.items():  # Slicer's wrapper needs None in a Union of node types
        if annotation.startswith(("Union[", "typing.Union[", "Optional[")):
            assert "None" in annotation or annotation.startswith("Optional["), f"{name}: Union[..., None] needed"
    for name in ("method", "useBundledWeights", "weightsFile", "device", "seed", "rotations", "samplingSteps",
                 "lesionWeightsFolder", "exactLesion", "checkBrainMask", "compareFade", "linkCameras", "exportFormat",
                 "inputContrast", "otherVolume1", "otherContrast1", "variationStrength"):
        assert name in fields
    assert "Choice(EXPORT_FORMATS)" in ast.unparse(fields["exportFormat"])
    assert "Choice(DEVICE_CHOICES)" in ast.unparse(fields["device"])
    assert re.search(r'DEVICE_CHOICES = \["auto", "cuda", "cpu"\]', MODULE_PY.read_text())


def test_other_contrasts_of_the_patient_are_loaded_with_a_contrast_each_and_the_variation_strength_is_bound():
    """Lesion method, several co-registered contrasts: the input's contrast and up to
    ``core.MAX_OTHER_CONTRASTS`` other volumes, each with its contrast, in the load step (the module
    reaches their widgets as ``otherVolume{n}Selector`` / ``otherContrast{n}ComboBox``)."""
    fields = _parameter_node_fields()
    core_source = (MODULE_DIR / "AnonMRIModuleLib" / "core.py").read_text(encoding="utf-8")
    count = int(re.search(r"^MAX_OTHER_CONTRASTS = (\d+)$", core_source, re.M).group(1))
    assert count == 3
    load = next(w for w in _ui_root().iter("widget") if w.get("class") == "ctkCollapsibleButton"
                and _property(w, "text") == "1. Load")
    in_load = {w.get("name"): w.get("class") for w in load.iter("widget")}
    assert in_load["otherContrastsCollapsibleButton"] == "ctkCollapsibleButton"
    assert in_load["inputContrastComboBox"] == "QComboBox"
    assert "Choice(CONTRAST_CHOICES)" in ast.unparse(fields["inputContrast"])
    for number in range(1, count + 1):
        assert in_load[f"otherVolume{number}Selector"] == "qMRMLNodeComboBox"
        assert in_load[f"otherContrast{number}ComboBox"] == "QComboBox"
        assert ast.unparse(fields[f"otherVolume{number}"]) == "slicer.vtkMRMLScalarVolumeNode"
        assert "Choice(CONTRAST_CHOICES)" in ast.unparse(fields[f"otherContrast{number}"])
    assert f"otherVolume{count + 1}" not in fields
    strength = ast.unparse(fields["variationStrength"])
    assert "WithinRange(0.0, 1.0)" in strength and "Default(DEFAULT_VARIATION_STRENGTH)" in strength
    assert "DEFAULT_VARIATION_STRENGTH = core.default_variation_strength()" in MODULE_PY.read_text(encoding="utf-8")
    spin_box = _widget("variationStrengthSpinBox")
    assert spin_box.get("class") == "QDoubleSpinBox" and _property(spin_box, "maximum") == "1.0"
    thickness = ast.unparse(fields["sliceThickness"])
    assert "WithinRange(0.0, 50.0)" in thickness and "Default(0.0)" in thickness
    thickness_box = _widget("sliceThicknessSpinBox")
    assert thickness_box.get("class") == "QDoubleSpinBox" and _property(thickness_box, "maximum") == "50.0"
    assert "sliceThickness=p.sliceThickness or mrml.dicom_slice_thickness(p.inputVolume)" in \
        MODULE_PY.read_text(encoding="utf-8")


def _widget(name):
    matches = [w for w in _ui_root().iter("widget") if w.get("name") == name]
    assert len(matches) == 1, name
    return matches[0]


def _property(widget, name):
    for prop in widget.findall("property"):
        if prop.get("name") == name:
            return "".join(prop.itertext()).strip()
    return None


def test_weights_selectors_take_a_file_for_cpgan_and_a_folder_for_the_lesion_method():
    assert "Files" in _property(_widget("weightsPathLineEdit"), "filters")
    assert "Dirs" in _property(_widget("lesionWeightsPathLineEdit"), "filters")
    assert "Files" not in _property(_widget("lesionWeightsPathLineEdit"), "filters")


def test_compare_and_export_controls():
    fade = _widget("fadeSliderWidget")
    assert fade.get("class") == "ctkSliderWidget" and _property(fade, "maximum") == "1.0"
    for name in ("compareButton", "show3DButton", "exportButton", "loadSampleButton", "previewButton",
                 "applyButton", "cancelButton"):
        assert _widget(name).get("class") == "QPushButton"
    assert _widget("linkCamerasCheckBox").get("class") == "QCheckBox"


def test_every_ui_widget_the_module_uses_exists():
    names = {w.get("name") for w in _ui_root().iter("widget")}
    used = set(re.findall(r"self\.ui\.(\w+)", MODULE_PY.read_text(encoding="utf-8")))
    used |= set(re.findall(r"widget\.ui\.(\w+)", MODULE_PY.read_text(encoding="utf-8")))
    assert used, "the module uses no widget?"
    assert used <= names, f"missing in the .ui: {sorted(used - names)}"


def test_module_has_module_widget_logic_test_and_parses_as_python_39():
    source = MODULE_PY.read_text(encoding="utf-8")
    ast.parse(source, feature_version=(3, 9))
    classes = {node.name: [ast.unparse(b) for b in node.bases] for node in ast.walk(_module_tree())
               if isinstance(node, ast.ClassDef)}
    assert "ScriptedLoadableModule" in classes["AnonMRI"]
    assert "ScriptedLoadableModuleWidget" in classes["AnonMRIWidget"]
    assert "ScriptedLoadableModuleLogic" in classes["AnonMRILogic"]
    assert "ScriptedLoadableModuleTest" in classes["AnonMRITest"]
    for helper in sorted((MODULE_DIR / "AnonMRIModuleLib").glob("*.py")):
        ast.parse(helper.read_text(encoding="utf-8"), feature_version=(3, 9))
    # Slicer loads every top-level .py of a module folder as a module: only AnonMRI.py is there
    assert [p.name for p in MODULE_DIR.glob("*.py")] == ["AnonMRI.py"]


def _cmake_sets(text):
    return dict(re.findall(r'set\((EXTENSION_\w+)\s+"([^"]*)"\)', text))


def test_top_level_cmakelists_has_what_the_extensions_index_checks():
    text = TOP_CMAKE.read_text(encoding="utf-8")
    assert re.search(r"^cmake_minimum_required\(", text, re.M)
    assert re.search(r"^project\(AnonMRI\)", text, re.M)
    values = _cmake_sets(text)
    for name in ("EXTENSION_HOMEPAGE", "EXTENSION_CATEGORY", "EXTENSION_CONTRIBUTORS", "EXTENSION_DESCRIPTION",
                 "EXTENSION_ICONURL", "EXTENSION_SCREENSHOTURLS", "EXTENSION_DEPENDS"):
        assert values.get(name, "").strip(), f"{name} is missing or empty"
    assert values["EXTENSION_HOMEPAGE"].startswith("https://")
    # one project home everywhere: the metadata, the module's help link and the weights' release assets
    home = values["EXTENSION_HOMEPAGE"].split("#")[0]
    owner_repo = home.split("github.com/")[1]
    assert f"githubusercontent.com/{owner_repo}/" in values["EXTENSION_ICONURL"]
    assert all(f"githubusercontent.com/{owner_repo}/" in url for url in values["EXTENSION_SCREENSHOTURLS"].split())
    assert home in MODULE_PY.read_text(encoding="utf-8")
    weights_store = (ROOT / "AnonMRILib" / "weights_store.py").read_text(encoding="utf-8")
    assert f'"{home}/releases/download/' in weights_store
    for url in values["EXTENSION_SCREENSHOTURLS"].split():  # the screenshots exist in the repository
        assert (ROOT / url.split("/main/")[1]).is_file(), url
    assert values["EXTENSION_ICONURL"].startswith("https://") and values["EXTENSION_ICONURL"].endswith(".png")
    assert all(url.startswith("https://") for url in values["EXTENSION_SCREENSHOTURLS"].split())
    order = ["find_package(Slicer REQUIRED)", "include(${Slicer_USE_FILE})", "add_subdirectory(AnonMRI)",
             "include(${Slicer_EXTENSION_GENERATE_CONFIG})", "include(${Slicer_EXTENSION_CPACK})"]
    positions = [text.find(statement) for statement in order]
    assert all(p >= 0 for p in positions), f"missing: {[s for s, p in zip(order, positions) if p < 0]}"
    assert positions == sorted(positions), "statements out of the template's order"
    assert "AnonMRILib/*.py" in text and "Slicer_QTSCRIPTEDMODULES_LIB_DIR" in text  # the library is installed


def test_license_and_extension_icon():
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:300]
    assert "Version 2.0" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:300]
    for icon in (ROOT / "AnonMRI.png", MODULE_DIR / "Resources" / "Icons" / "AnonMRI.png"):
        header = icon.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", header[16:24])
        assert (width, height) == (128, 128)


def _cmake_list(text, variable):
    """Entries of ``set(<variable> ...)`` with ${MODULE_NAME} expanded."""
    block = re.search(r"set\(" + variable + r"\s+(.*?)\)", text, re.S)
    assert block, f"no set({variable} ...)"
    return [entry.replace("${MODULE_NAME}", "AnonMRI") for entry in block.group(1).split()]


def test_module_cmakelists_builds_every_module_file():
    text = MODULE_CMAKE.read_text(encoding="utf-8")
    assert re.search(r"set\(MODULE_NAME AnonMRI\)", text)
    assert "slicerMacroBuildScriptedModule(" in text
    assert "slicer_add_python_unittest(SCRIPT ${MODULE_NAME}.py)" in text
    scripts = _cmake_list(text, "MODULE_PYTHON_SCRIPTS")
    resources = _cmake_list(text, "MODULE_PYTHON_RESOURCES")
    for relative in scripts + resources:
        assert (MODULE_DIR / relative).is_file(), f"AnonMRI/CMakeLists.txt lists a missing file: {relative}"
    assert "AnonMRI.py" in scripts
    for helper in sorted((MODULE_DIR / "AnonMRIModuleLib").glob("*.py")):
        assert f"AnonMRIModuleLib/{helper.name}" in scripts, f"{helper.name} is not built into the extension"
    assert {"Resources/Icons/AnonMRI.png", "Resources/UI/AnonMRI.ui"} <= set(resources)


@pytest.mark.parametrize("path", ["AnonMRI/AnonMRI.py", "AnonMRI/AnonMRIModuleLib/mrml.py",
                                  "AnonMRI/AnonMRIModuleLib/core.py", "AnonMRI/AnonMRIModuleLib/tasks.py",
                                  "AnonMRI/AnonMRIModuleLib/render3d.py", "AnonMRI/AnonMRIModuleLib/jobs.py",
                                  "AnonMRI/AnonMRIModuleLib/compare.py", "AnonMRI/AnonMRIModuleLib/dependencies.py",
                                  "AnonMRILib/worker.py", "AnonMRILib/weights_store.py"])
def test_module_files_never_use_python_310_syntax(path):
    source = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(source, feature_version=(3, 9))
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Match), f"{path}: match statement"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            text = ast.unparse(node)
            assert "None" not in text and "vtkMRML" not in text, f"{path}: X | Y type union: {text}"
