"""``dit report`` (:mod:`dit.report.build`) and the unit formatting every view shares (:mod:`dit.report.units`).

Kept free of imports so that ``dit.report.units`` stays cheap for the CLI.
"""
