"""One training run: its configuration (:mod:`.config`), the loop (:mod:`.trainer`), its warm
starts from a history or a prefill (:mod:`.warmstart`), its commands (:mod:`.main`), its folder
(:mod:`.rundir`, :mod:`.provenance`) and summary (:mod:`.summary`), MLflow (:mod:`.tracking`),
the evaluation of a checkpoint (:mod:`.evaluate`) and the base models built locally
(:mod:`.tiny_model`, :mod:`.random_model`).
"""
