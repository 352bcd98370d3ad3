"""``dit reproduce CHAPTER``: a chapter's results from a fresh clone in one command.

Each chapter (:mod:`dit.reproduce.chapters`) is a list of scenario variants at a size (``quick``: minutes
on a small machine, a reduced model and fewer points; ``full``: the article's configuration for the real
rack), run where asked (local mode, the emulated rack, or an inventory) by :mod:`dit.reproduce.execute`,
which skips a variant already finished in the output directory (by scenario hash), and read into one
self-contained HTML report (:mod:`dit.reproduce.report`). Every table has three columns where they
exist: **measured here** (with the core count, load, network backend and model), **simulated for the
article's rack** (:mod:`dit.sim`), and **the article's figure** (:mod:`dit.reproduce.article`), and a
sentence per row saying whether it reproduces, and why not where it does not. An input that is missing
(a run that failed, a framework not installed) is said in its row, never left out.
"""
