"""Single-process local backend: DAPO end to end on one machine (CPU, or one GPU), no verl, no ray.

Entry point: :func:`dapo_verl.local.train.run` (``dapo-verl train``). Importing this package is cheap;
the submodules that need torch, transformers and Hydra are imported by whoever uses them.

Modules: ``config`` (local knobs), ``compose`` (Hydra composition and checks), ``tasks`` (synthetic
verifiable tasks), ``model`` (tokenizer and tiny model, cached), ``rollout`` (generation, verifier,
reward shaping), ``actor`` (the policy update), ``checkpoint``, ``tracking``, ``plots``, ``train``.
"""
