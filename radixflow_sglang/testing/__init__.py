"""Test and evaluation infrastructure on SGLang's real classes (CPU): the kit, the step harness
with its invariant checks, and a real server process helper. Not imported by serving code."""
