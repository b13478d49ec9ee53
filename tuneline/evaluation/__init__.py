"""The torch side of `tuneline.evaluate`: model loading, teacher-forced scores, generation and text metrics.

Imported only when an evaluation actually runs (never on a cache hit).
"""
