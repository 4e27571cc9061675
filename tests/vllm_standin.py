"""A stand-in for the ``vllm`` module with vLLM 0.33's signatures, for CPU tests of
:class:`gmc.rollouts.vllm_engine.VLLMEngine`: every method the engine calls has the parameters of its
0.33 original (``vllm/entrypoints/llm.py``, ``vllm/sampling_params.py``,
``vllm/v1/worker/gpu_model_runner.py``), so a wrong name or argument fails as it would there,
and the sleep rules of ``vllm/v1/engine/core.py`` hold: nothing is scheduled while any memory
is asleep, weights discarded at level 2 hold garbage until they are reloaded, and the prefix
cache is cleared by a sleep. Generation answers every prompt with the same few tokens at
log-prob -1. Every call is appended to :data:`EVENTS`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

EVENTS: list[tuple] = []
"""(call, arguments) of every call, in order; a test clears it."""

ENGINE_ARGS = {"disable_log_stats", "enable_prefix_caching", "enable_sleep_mode", "logprobs_mode", "max_model_len"}
"""The ``EngineArgs`` fields (``vllm/engine/arg_utils.py``) the engine passes through ``**kwargs``."""
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
SLEEP_TAGS = ("weights", "kv_cache")
ANSWER = " \\boxed{1}"


@dataclass(kw_only=True)
class SamplingParams:
    """``vllm.SamplingParams`` (0.33): the fields the engine may set, with their defaults."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None

    def __post_init__(self):
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed out of int64: {self.seed}")


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class Worker:
    """The GPU worker's methods reached through ``collective_rpc``."""

    def __init__(self, llm: LLM):
        self.llm = llm

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format: bool = True) -> None:
        dtypes = [str(tensor.dtype).removeprefix("torch.") for _, tensor in weights_iterator]
        EVENTS.append(
            (
                "reload_weights",
                {"tensors": len(dtypes), "dtypes": sorted(set(dtypes)), "is_checkpoint_format": is_checkpoint_format},
            )
        )
        if "weights" in self.llm.sleeping:
            raise RuntimeError("reload_weights into weights that are asleep")
        self.llm.garbage_weights = False


class LLM:
    def __init__(
        self,
        model: str,
        *,
        runner="auto",
        convert="auto",
        tokenizer: str | None = None,
        tokenizer_mode="auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        allowed_local_media_path: str = "",
        allowed_media_domains=None,
        tensor_parallel_size: int = 1,
        dtype="auto",
        quantization=None,
        revision=None,
        tokenizer_revision=None,
        chat_template=None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        cpu_offload_gb: float = 0,
        offload_group_size: int = 0,
        offload_num_in_group: int = 1,
        offload_prefetch_step: int = 1,
        offload_params=None,
        enforce_eager: bool = False,
        enable_return_routed_experts: bool = False,
        return_sampling_mask: bool = False,
        disable_custom_all_reduce: bool = False,
        hf_token=None,
        hf_overrides=None,
        mm_processor_kwargs=None,
        pooler_config=None,
        structured_outputs_config=None,
        profiler_config=None,
        attention_config=None,
        kv_cache_memory_bytes: int | None = None,
        compilation_config=None,
        quantization_config=None,
        logits_processors=None,
        spec_method=None,
        spec_model=None,
        spec_tokens=None,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - ENGINE_ARGS
        if unknown:
            raise TypeError(f"EngineArgs has no field {sorted(unknown)}")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {kwargs['logprobs_mode']!r}")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.sleep_mode = kwargs.get("enable_sleep_mode", False)
        self.sleeping: set[str] = set()
        self.garbage_weights = False
        self.prefix_cache = set()
        self.worker = Worker(self)
        EVENTS.append(("LLM", {"model": model, "dtype": dtype, "seed": seed, **kwargs}))

    def get_tokenizer(self):
        return self.tokenizer

    def generate(
        self,
        prompts,
        sampling_params=None,
        *,
        use_tqdm=True,
        lora_request=None,
        priority=None,
        tokenization_kwargs=None,
        mm_processor_kwargs=None,
    ) -> list[RequestOutput]:
        if self.sleeping:
            raise RuntimeError(f"generate while {sorted(self.sleeping)} asleep: the scheduler is paused")
        if self.garbage_weights:
            raise RuntimeError("generate with weights discarded at sleep level 2 and never reloaded")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("the lengths of prompts and sampling_params must be the same")
        EVENTS.append(("generate", {"requests": len(prompts)}))
        answer = self.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
        outputs = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            ids = (answer + [p.stop_token_ids[0]] if p.stop_token_ids else answer)[: p.max_tokens]
            logprobs = [{t: Logprob(-1.0, 1)} for t in ids] if p.logprobs is not None else None
            self.prefix_cache.add(prompt)
            outputs.append(
                RequestOutput(
                    str(i),
                    prompt,
                    self.tokenizer(prompt, add_special_tokens=False)["input_ids"],
                    [CompletionOutput(0, ANSWER, ids, -float(len(ids)), logprobs, "stop")],
                )
            )
        return outputs

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        EVENTS.append(("reset_prefix_cache", {}))
        self.prefix_cache.clear()
        return True

    def sleep(self, level: int = 1, mode: Literal["abort", "wait", "keep"] = "abort"):
        if not self.sleep_mode:
            raise RuntimeError("sleep mode is not enabled (enable_sleep_mode)")
        EVENTS.append(("sleep", {"level": level}))
        if level >= 1:
            self.prefix_cache.clear()
            self.sleeping |= set(SLEEP_TAGS)
            self.garbage_weights = level == 2

    def wake_up(self, tags: list[str] | None = None) -> bool:
        if tags is not None and set(tags) - {*SLEEP_TAGS, "scheduling"}:
            raise ValueError(f"tags {tags}")
        EVENTS.append(("wake_up", {"tags": tags}))
        self.sleeping -= set(SLEEP_TAGS if tags is None else tags)
        return not self.sleeping
