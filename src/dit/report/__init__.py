"""``dit report`` (:mod:`dit.report.build`): one self-contained HTML file per run or sweep.

The unit formatting it shares with ``dit show``, NNPM and ``run.log`` is :mod:`dit.units`.
"""
