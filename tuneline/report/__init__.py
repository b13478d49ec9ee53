"""What a finished run shows people: training curves (PNG) and the model card (README.md)."""

from tuneline.report.model_card import framework_versions, write_model_card
from tuneline.report.plots import PLOT_KEYS, STAGE_PLOT_KEYS, plot_curves, smooth

__all__ = ["PLOT_KEYS", "STAGE_PLOT_KEYS", "framework_versions", "plot_curves", "smooth", "write_model_card"]
