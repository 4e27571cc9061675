"""Rollout throughput on the tiny model: HFEngine against a plain ``model.generate`` loop.

Same prompts, n samples each, temperature 1, top_p 1, the same token limit. The alternative
is Hugging Face ``generate`` with ``output_scores`` (needed for the sampler's log-probs). A
third row runs the engine's loop through the model's own forward (``HFDecoder``) instead of
the lean Qwen3 decoder, to show what each part contributes.
Run: python bench/rollout.py [MODEL_DIR]   (default results/models/tiny)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import interleaved, write_result  # noqa: E402

import gmc.rollouts.hf_engine  # noqa: E402
from gmc.policy.model import load_policy  # noqa: E402
from gmc.rollouts.decoding import HFDecoder  # noqa: E402
from gmc.rollouts.engines import SamplingConfig  # noqa: E402
from gmc.rollouts.hf_engine import HFEngine  # noqa: E402
from gmc.tasks.datasets import PLAIN_TEMPLATE  # noqa: E402
from gmc.tasks.synthetic import SyntheticTask  # noqa: E402

PROMPTS, N, MAX_NEW = 8, 8, 48


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "results/models/tiny/seed~0"
    model, tok = load_policy(model_dir, device="cpu")
    model.eval()
    prompts = [PLAIN_TEMPLATE.format(problem=r.problem) for r in SyntheticTask().generate("test", PROMPTS, seed=3)]
    engine = HFEngine(model, tok, seed=0)
    sampling = SamplingConfig(1.0, 1.0, MAX_NEW)
    tokens = {}

    def ours():
        groups = engine.generate(prompts, N, sampling)
        tokens["ours"] = sum(s.length for g in groups for s in g)

    def ours_hf_forward():
        lean = gmc.rollouts.hf_engine.make_decoder
        gmc.rollouts.hf_engine.make_decoder = lambda model, capacity: HFDecoder(model)
        try:
            groups = engine.generate(prompts, N, sampling)
        finally:
            gmc.rollouts.hf_engine.make_decoder = lean
        tokens["ours_hf_forward"] = sum(s.length for g in groups for s in g)

    enc = tok([p for p in prompts for _ in range(N)], return_tensors="pt", padding=True)

    @torch.no_grad()
    def hf_generate():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=MAX_NEW,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
        )
        new = out.sequences[:, enc["input_ids"].shape[1] :]
        logp = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        ended = (new == tok.eos_token_id).cumsum(1)
        valid = (ended == 0) | ((ended == 1) & (new == tok.eos_token_id))
        tokens["hf"] = int(valid.sum())
        return logp

    timed = interleaved({"ours": ours, "ours_hf_forward": ours_hf_forward, "hf": hf_generate}, rounds=9)
    t_ours, t_ours_hf, t_hf = timed["ours"], timed["ours_hf_forward"], timed["hf"]
    ours_tps = tokens["ours"] / t_ours["median_s"]
    ours_hf_tps = tokens["ours_hf_forward"] / t_ours_hf["median_s"]
    hf_tps = tokens["hf"] / t_hf["median_s"]
    write_result(
        "rollout",
        {
            "prompts": PROMPTS,
            "samples_per_prompt": N,
            "max_new_tokens": MAX_NEW,
            "hf_engine": {**t_ours, "tokens": tokens["ours"], "tokens_per_s": ours_tps},
            "hf_engine_model_forward": {**t_ours_hf, "tokens": tokens["ours_hf_forward"], "tokens_per_s": ours_hf_tps},
            "model_generate": {**t_hf, "tokens": tokens["hf"], "tokens_per_s": hf_tps},
            "ratio_tokens_per_s": ours_tps / hf_tps,
        },
    )


if __name__ == "__main__":
    main()
