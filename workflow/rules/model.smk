if MODEL_NAME in BUILT_MODELS:
    # a model built per seed has a config and a folder per seed (gmc.sweep.resolve.PER_SEED_MODELS)

    rule model_config:
        """The settings of the locally built base model (TinyModelConfig or RandomModelConfig)."""
        output:
            per_seed(f"{RESULTS}/configs/model", ".yaml"),
        log:
            per_seed(f"{RESULTS}/logs/model_config", ".log"),
        priority: BUILD_PRIORITY
        localrule: True
        conda:
            CONDA_ENV
        params:
            kind=MODEL_NAME,
            values=lambda wildcards: SWEEP.model_settings(seed_of(wildcards)),
        script:
            "../scripts/write_config.py"


if MODEL_NAME == "tiny":

    rule build_tiny_model:
        """Build and warm-start the tiny Qwen3-architecture policy on the synthetic task, once per seed."""
        input:
            cfg=per_seed(f"{RESULTS}/configs/model", ".yaml"),
        output:
            directory(per_seed(f"{RESULTS}/models/tiny")),
        log:
            per_seed(f"{RESULTS}/logs/build_tiny_model", ".log"),
        priority: BUILD_PRIORITY
        conda:
            CONDA_ENV
        threads: 1
        shell:
            "OMP_NUM_THREADS={threads} python -m gmc build-tiny-model --out {output} --config {input.cfg} "
            "> {log} 2>&1"

elif MODEL_NAME == "random-qwen3":

    rule build_random_model:
        """A random-init Qwen3-architecture model with Qwen3's vocabulary width and chat format, built locally."""
        input:
            cfg=f"{RESULTS}/configs/model.yaml",
        output:
            directory(MODEL_DIR),
        log:
            f"{RESULTS}/logs/build_random_model.log",
        priority: BUILD_PRIORITY
        conda:
            CONDA_ENV
        threads: 1
        params:
            source=CONFIG.data_source,
            root=f"--data-root {CONFIG.data_root}" if CONFIG.data_root else "",
        shell:
            "OMP_NUM_THREADS={threads} python -m gmc build-random-model --out {output} --config {input.cfg} "
            "--source {params.source} {params.root} > {log} 2>&1"

elif not LOCAL_MODEL:

    rule fetch_model:
        """Download the base model from the Hugging Face hub once (on the submitting machine)."""
        output:
            directory(MODEL_DIR),
        log:
            f"{RESULTS}/logs/fetch_model.log",
        priority: BUILD_PRIORITY
        localrule: True
        conda:
            CONDA_ENV
        params:
            name=CONFIG.model,
        shell:
            "python -m gmc fetch-model --name {params.name} --out {output} > {log} 2>&1"
