"""One training run: its configuration (:mod:`.config`), the loop (:mod:`.trainer`), its folder
(:mod:`.rundir`, :mod:`.provenance`), MLflow (:mod:`.tracking`), the evaluation of a checkpoint
(:mod:`.evaluate`) and the base models built locally (:mod:`.tiny_model`, :mod:`.random_model`).
"""
