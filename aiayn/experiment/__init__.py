"""Experiments: sweeps of variants over a base run config (``aiayn experiment SWEEP.toml``).

* ``spec`` -- the sweep file: a base config, the work every variant
  gets, and the variants.
* ``run`` -- each variant a resumable run, scored by perplexity and
  sacreBLEU, with its FLOPs and time.
* ``report`` -- JSON, CSV, a markdown table in Table 3's layout, a plot.
"""

from aiayn.experiment.report import markdown_table, write_report
from aiayn.experiment.run import collect, run_sweep, run_variant
from aiayn.experiment.spec import Sweep, Variant, load_sweep

__all__ = [
    "Sweep",
    "Variant",
    "collect",
    "load_sweep",
    "markdown_table",
    "run_sweep",
    "run_variant",
    "write_report",
]
