"""Tasks: what the policy is asked and how its answers are graded (method.md section 5).

:mod:`.datasets` holds the registry of benchmarks and training sets (``BENCHMARKS``,
``TRAIN_SETS``), their records and the prompt format; :mod:`.synthetic` the synthetic arithmetic
task the tiny CPU runs train on; :mod:`.prepare` fills or checks a local data root; :mod:`.answers`
extracts and normalises final answers; :mod:`.grading` grades them with math-verify in a pool of
processes with timeouts. Nothing here imports torch.
"""
