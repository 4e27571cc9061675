"""The theory lab (method.md section 1): an exactly solvable tabular world in which the paper's
claims about the estimators are checked numerically (:mod:`.lab`), and its figures (:mod:`.figures`).
"""
