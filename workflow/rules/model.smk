if config["model"]["name"] == "tiny":

    rule build_tiny_model:
        """Build and warm-start the tiny Qwen3-architecture policy on the synthetic task."""
        output:
            directory(MODEL_DIR),
        log:
            f"{RESULTS}/logs/build_tiny_model.log",
        conda:
            CONDA_ENV
        threads: 2
        params:
            tiny=config["model"]["tiny"],
        shell:
            "OMP_NUM_THREADS={threads} python -m gmc build-tiny-model --out {output} "
            "--target-accuracy {params.tiny[target_accuracy]} --max-steps {params.tiny[max_steps]} "
            "--seed {params.tiny[seed]} > {log} 2>&1"

else:

    rule fetch_model:
        """Download the base model from the Hugging Face hub once (on the submitting machine)."""
        output:
            directory(MODEL_DIR),
        log:
            f"{RESULTS}/logs/fetch_model.log",
        localrule: True
        conda:
            CONDA_ENV
        params:
            name=config["model"]["name"],
        shell:
            "python -m gmc fetch-model --name {params.name} --out {output} > {log} 2>&1"
