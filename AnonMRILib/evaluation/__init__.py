"""Evaluation: image metrics, anonymity criterion, re-identification attack, brain-analysis agreement."""
