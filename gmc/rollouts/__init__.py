"""Rollouts: groups of sampled answers, labelled with the policy version that generated them, and
the sources that hand them to the trainer stale (method.md section 4).

Torch-free settings and registries first: :mod:`.groups` (``Group``, ``Batch``), :mod:`.delays`
(``DelayConfig`` and the delay modes ``DELAY_MODES``) and :mod:`.engines` (``SamplingConfig`` and the
rollout engines ``ENGINES``). Their implementations beside them: :mod:`.sources` (the simulated
sources ``sync``, ``fixed``, ``latency``, ``trace``), :mod:`.collect` (prompts -> generate ->
grade -> behaviour log-probs -> groups), :mod:`.streams`, :mod:`.hf_engine`, :mod:`.vllm_engine`
and :mod:`.decoding` (generation), and :mod:`.ray` (real asynchrony: rollout workers on Ray).
"""
