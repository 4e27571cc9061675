"""The policy: a causal language model, how it is loaded and built, and how one optimizer step's
gradient is computed from rollouts (method.md section 7).

:mod:`.model` loads a policy and computes token log-probs with a chunked LM head; :mod:`.build`
builds Qwen3-architecture models and tokenizers locally; :mod:`.preflight` checks a model folder
before anything loads it; :mod:`.logprobs` runs every pass over rollouts in canonical
micro-batches; :mod:`.update` gives the step's gradient; :mod:`.memory` plans a run's device memory.
"""
