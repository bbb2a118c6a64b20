"""The open face judge of the face tests: dlib's detector and recognizer (nobody here wrote them)."""
import pytest

#: the detector's score of real heads' anterior renderings is 1.70-2.48 (docs/reface/faces.md); a
#: remodeled or refaced face must score above this
MIN_DETECTOR_SCORE = 1.2
#: the recognizer's distance from the patient a new face must exceed (different people: 0.55-0.71)
MIN_DISTANCE = 0.45


def assert_another_natural_face(head, output) -> None:
    """dlib's HOG detector finds a face in ``output``'s anterior rendering scoring above
    :data:`MIN_DETECTOR_SCORE`, and its ResNet descriptor puts that face further from ``head``'s
    than :data:`MIN_DISTANCE` and than three times a re-rendering of ``head`` (3 deg turned)."""
    pytest.importorskip("dlib")
    from AnonMRILib.evaluation.face_recognition import FaceRecognizer, face_distance
    from AnonMRILib.rendering import render_face

    recognizer = FaceRecognizer()
    original, after = render_face(head, size=256), render_face(output, size=256)
    detection = recognizer.detect(after)
    assert detection is not None and detection.score > MIN_DETECTOR_SCORE
    same_person = face_distance(recognizer.descriptor(original),
                                recognizer.descriptor(render_face(head, size=256, azimuth_deg=3.0)))
    distance = face_distance(recognizer.descriptor(original), recognizer.descriptor(after, detection))
    assert distance > MIN_DISTANCE and distance > 3 * same_person
