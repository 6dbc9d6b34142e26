"""Evaluation: translation quality (sacreBLEU, chrF) and language-model loss."""
