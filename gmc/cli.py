"""Command line: ``gmc <subcommand> ...`` (also ``python -m gmc``)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from gmc import theory

    parser = argparse.ArgumentParser(prog="gmc", description="Asynchronous RL post-training with group-mass capping")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("theory", help="exactly solvable checks of the paper's claims (CSV + figures)")
    theory.add_arguments(p)
    p.set_defaults(func=theory.run_from_args)

    p = sub.add_parser("build-tiny-model", help="build and warm-start the tiny CPU policy")
    p.add_argument("--out", required=True, help="folder for the saved model and tokenizer")
    p.add_argument("--target-accuracy", type=float, default=0.4)
    p.add_argument("--max-seconds", type=float, default=150.0)
    p.add_argument("--max-steps", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_build_tiny_model)

    p = sub.add_parser("grade-oracle", help="grade each benchmark's reference solutions against its gold answers")
    p.add_argument("--data", default=None, help="local data root (default: $GMC_DATA_ROOT or ../shared/data)")
    p.add_argument("--benchmarks", nargs="*", default=None, help="default: every benchmark with reference solutions")
    p.add_argument("--out", default=None, help="optional JSON file for the agreement table")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=_grade_oracle)
    return parser


def _build_tiny_model(args: argparse.Namespace) -> None:
    from gmc.policy import TinyModelConfig, build_tiny_model

    cfg = TinyModelConfig(target_accuracy=args.target_accuracy, max_seconds=args.max_seconds,
                          max_steps=args.max_steps, seed=args.seed)
    summary = build_tiny_model(args.out, cfg)
    print(f"tiny model: {summary['parameters']:,} parameters, greedy accuracy {summary['greedy_accuracy']:.3f} "
          f"after {summary['steps']} steps in {summary['seconds']:.0f} s -> {args.out}")


def _grade_oracle(args: argparse.Namespace) -> None:
    from gmc.io import write_json
    from gmc.rewards import grade_oracle

    table = grade_oracle(args.benchmarks, root=args.data, timeout=args.timeout)
    for name, row in table.items():
        print(f"{name:15s} {row['agreement']:.4f}  ({row['correct']}/{row['n']}; reasons {row['reasons']})")
    if args.out:
        write_json(args.out, table)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
