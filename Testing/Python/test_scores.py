"""The open face recognizer's single-subject rule with its template-kinship control."""


def test_the_recognizer_rule_clears_a_match_the_template_alone_makes():
    """Top-1 counts as identified unless the template's own face is as near (within re-rendering noise)."""
    from AnonMRILib.evaluation.scores import recognizer_identifies

    references = [0.55, 0.60, 0.70]
    assert recognizer_identifies(0.60, references) == (False, False)                 # a reference is nearer
    assert recognizer_identifies(0.50, references) == (True, False)                  # top-1, no control
    assert recognizer_identifies(0.50, references, 0.80, 0.08) == (True, False)      # far nearer than the template
    assert recognizer_identifies(0.51, references, 0.52, 0.08) == (False, True)      # the template's resemblance
    assert recognizer_identifies(0.35, references, 0.52, 0.08) == (True, False)      # nearer beyond the noise
    assert recognizer_identifies(0.55, references, 0.52, 0.08) == (False, False)    # a tie counts against it
    assert recognizer_identifies(0.50, [], 0.52, 0.08) == (False, False)
