"""Where the time of our training step goes: a pyinstrument profile of the synchronous step of
``bench/trl_step.py`` (same model, batch, group size, token limit and sampling), written to
``bench/results/trl_step_profile.txt``; with ``key=value`` overrides (e.g. ``delay.mode=fixed
delay.d=16``) the profile of that setting, written to ``step_profile_<overrides>.txt``.
Needs the bench extra. Run: python bench/profile_step.py [MODEL_DIR] [STEPS] [KEY=VALUE ...]
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS  # noqa: E402
from pyinstrument import Profiler  # noqa: E402
from trl_step import our_config  # noqa: E402

from gmc.io import write_text  # noqa: E402
from gmc.run.trainer import Trainer  # noqa: E402


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "results/models/tiny/seed~0"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    overrides = sys.argv[3:]
    cfg = our_config(model_dir, steps + 2, *overrides)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", progress=False)
        for _ in range(2):  # warm-up
            trainer.train_step()
            trainer.step += 1
        profiler = Profiler()
        profiler.start()
        for _ in range(steps):
            trainer.train_step()
            trainer.step += 1
        profiler.stop()
        trainer.close()
    text = profiler.output_text(unicode=False, color=False)
    name = "step_profile_" + "_".join(o.replace("=", "-") for o in overrides) if overrides else "trl_step_profile"
    write_text(RESULTS / f"{name}.txt", text)
    print(text)


if __name__ == "__main__":
    main()
